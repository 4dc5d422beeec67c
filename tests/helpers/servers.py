"""Servers on 127.0.0.1 for tests and benchmarks: free ports, waiting for HTTP, a Range-capable file server with
fault injection, and a real Prefect server (plus pointing this process's Prefect client at it).

RangeServer: `served` counts the body bytes sent per path (`bytes_served`: all of them: the byte counter). Faults
are queued per URL path and each one is used by one GET: `("drop", n)` closes the connection after n body bytes,
`("cut", n)` sends no Content-Length (nor a total in Content-Range) and ends the body after n bytes as if it were
complete, `("status", code)` answers with that status, `("stall", seconds)` sends a little then goes quiet,
`("ignore_range",)` answers 200 with the whole file, `("flip",)` flips one byte of the body, `("shift", k)` sends
the bytes k further on than asked (same length), `("hang",)` reads the request and never answers (until the server
stops), `("delay", seconds)` answers normally after that long. `every`: a fault used by every ranged GET that has no
queued one (`("flip",)`: a byte flipped in every range reply). `corrupt` (a set of paths) serves those files with a
flipped byte on every request. `auth`: ("basic", user, password) or ("header", name, value) that every request must
carry (else 401). Ranges: `bytes=a-` and `bytes=a-b`. Run standalone: `python tests/helpers/servers.py ROOT PORT`.

Standard library only at module level (prefect is imported where it is used), so that tests/conftest.py can
isolate Prefect before anything imports it."""
from __future__ import annotations

import base64
import contextlib
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import defaultdict, deque
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(probe, timeout: float, explain=lambda: "", interval: float = 0.5):
    """Poll `probe()` until it returns something truthy (returned), or fail after `timeout` seconds with
    `explain()` (its last 3000 characters) in the message."""
    deadline = time.monotonic() + timeout
    while not (found := probe()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s\n{explain()[-3000:]}")
        time.sleep(interval)
    return found


def wait_http(url: str, timeout: float = 60.0) -> None:
    """Wait until `url` answers with a success."""
    errors: list[Exception] = []

    def answers() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return True
        except Exception as err:
            errors[:] = [err]
            return False

    wait_for(answers, timeout, lambda: f"{url} does not answer: {errors[-1] if errors else ''}", interval=0.3)


def stop_process(proc: subprocess.Popen, timeout: float = 20) -> None:
    """SIGTERM, then SIGKILL if it has not exited after `timeout` seconds."""
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# ---------------------------------------------------------------- Prefect
def isolate_prefect() -> None:
    """Before anything imports prefect (it reads its settings once, on import): a fresh PREFECT_HOME (no profile,
    no database of the user's), warnings-only logs, no analytics. Child processes inherit it."""
    os.environ["PREFECT_HOME"] = tempfile.mkdtemp(prefix="prefect-home-")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("DO_NOT_TRACK", "1")



@contextlib.contextmanager
def moto_s3_server() -> Iterator[tuple[str, object]]:
    """moto's S3 server on 127.0.0.1 (a free port); yields (endpoint, a boto3 S3 client with moto's test keys)."""
    import boto3
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    try:
        yield endpoint, boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                                     aws_access_key_id="testing", aws_secret_access_key="testing")
    finally:
        server.stop()

class CountingMotoServer:
    """moto's S3 server on 127.0.0.1 (its own WSGI app, as ThreadedMotoServer runs it) that counts the body bytes of
    every GET reply per path (`served`, `bytes_served`): the byte counter of an S3 remote."""

    def __init__(self, port: int) -> None:
        from moto.server import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
        from werkzeug.serving import make_server

        app = DomainDispatcherApplication(create_backend_app)
        self.served: dict[str, int] = defaultdict(int)
        self._lock = threading.Lock()

        def counted(environ, start_response):
            body = app(environ, start_response)
            get, path = environ.get("REQUEST_METHOD") == "GET", environ.get("PATH_INFO", "")
            for chunk in body:
                if get:
                    with self._lock:
                        self.served[path] += len(chunk)
                yield chunk

        self.server = make_server("127.0.0.1", port, counted, True, request_handler=MotoRequestHandler)
        self.endpoint = f"http://127.0.0.1:{port}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def bytes_served(self) -> int:
        with self._lock:
            return sum(self.served.values())

    def __enter__(self) -> CountingMotoServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self._thread.join()


@contextlib.contextmanager
def prefect_server(log: Path, timeout: float = 90) -> Iterator[str]:
    """A real `prefect server start` on a free 127.0.0.1 port, its UI talking to it, output in `log`; yields the
    API URL (http://127.0.0.1:PORT/api) and stops the server on exit."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/api"
    # the UI's API address is derived from port 4200 unless told: the run-form smoke test loads the UI
    env = {**os.environ, "PREFECT_API_URL": url, "PREFECT_UI_API_URL": url, "PREFECT_UI_ENABLED": "true"}
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
            stdout=out, stderr=subprocess.STDOUT, env=env,
        )
        try:
            try:
                wait_http(url + "/health", timeout=timeout)
            except Exception:
                raise RuntimeError(f"prefect server did not answer at {url}:\n{log.read_text()[-3000:]}") from None
            yield url
        finally:
            stop_process(proc)


_API_KEYS = ("PREFECT_API_URL", "PREFECT_UI_API_URL")


@contextlib.contextmanager
def prefect_api_at(url: str) -> Iterator[None]:
    """Point this process's Prefect client and every child process (stage commands, `dvc repro`, a served
    deployment) at the server at `url`, until exit.

    Child processes read the environment. This process's Prefect read its settings when first imported (test
    collection imports it), so the environment alone does not reach it: its root settings context is rebuilt from
    the environment here, and again on exit."""
    import prefect.context

    saved = {key: os.environ.get(key) for key in _API_KEYS}
    os.environ.update(dict.fromkeys(_API_KEYS, url))
    prefect.context.refresh_global_settings_context()
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        prefect.context.refresh_global_settings_context()


# ---------------------------------------------------------------- a Range HTTP file server with faults
class RangeServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, root: Path, port: int = 0) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        self.root = Path(root)
        self.faults: dict[str, deque] = defaultdict(deque)
        self.corrupt: set[str] = set()
        self.every: tuple | None = None
        self.auth: tuple[str, str, str] | None = None
        self.stopping = threading.Event()
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Range header)
        self.served: dict[str, int] = defaultdict(int)  # body bytes sent, per path (the byte counter)
        self._count = threading.Lock()
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    @property
    def bytes_served(self) -> int:
        """Body bytes sent so far, all paths together."""
        with self._count:
            return sum(self.served.values())

    def count(self, path: str, sent: int) -> None:
        with self._count:
            self.served[path] += sent

    def __enter__(self) -> RangeServer:
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.shutdown()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    server: RangeServer
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:  # quiet
        pass

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def do_GET(self) -> None:
        self._serve(body=True)

    def _serve(self, body: bool) -> None:
        srv = self.server
        path = self.path.split("?")[0]
        srv.requests.append((self.command, path, self.headers.get("Range")))
        fault = srv.faults[path].popleft() if body and srv.faults[path] else None
        if fault is None and body and srv.every and self.headers.get("Range"):
            fault = srv.every
        if not self._authorized():
            return self._empty(401, {"WWW-Authenticate": 'Basic realm="test"'})
        if fault and fault[0] == "delay":
            time.sleep(fault[1])
        if fault and fault[0] == "hang":
            srv.stopping.wait(120)
            self.close_connection = True
            return None
        file = srv.root / path.lstrip("/")
        if fault and fault[0] == "status":
            return self._empty(fault[1])
        if not file.is_file():
            return self._empty(404)
        size = file.stat().st_size
        start, end = 0, size
        match = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range") or "")
        if match and not (fault and fault[0] == "ignore_range"):
            start, end = int(match.group(1)), min(size, int(match.group(2) or size - 1) + 1)
            if start >= size:
                return self._empty(416, {"Content-Range": f"bytes */{size}"})
            self.send_response(206)
            total = "*" if fault and fault[0] == "cut" else size
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{total}")
        else:
            self.send_response(200)
        if fault and fault[0] == "cut":  # the body ends where the connection closes
            self.send_header("Connection", "close")
        else:
            self.send_header("Content-Length", str(end - start))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        if body:
            if fault and fault[0] == "shift":
                start, end = start + fault[1], end + fault[1]
            self._body(file, start, end, fault, path in srv.corrupt or bool(fault and fault[0] == "flip"))

    def _authorized(self) -> bool:
        auth = self.server.auth
        if auth is None:
            return True
        kind, name, value = auth
        if kind == "header":
            return self.headers.get(name) == value
        token = base64.b64encode(f"{name}:{value}".encode()).decode()
        return self.headers.get("Authorization") == f"Basic {token}"

    def _empty(self, code: int, headers: dict[str, str] | None = None) -> None:
        self.send_response(code)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _body(self, file: Path, start: int, end: int, fault: tuple | None, corrupt: bool) -> None:
        count = end - start
        if fault and fault[0] in ("drop", "cut"):
            count = min(count, fault[1])
        if fault and fault[0] == "stall":
            count = min(count, 1024)
        try:
            self.wfile.flush()
            with open(file, "rb") as fh:
                if corrupt:
                    fh.seek(start)
                    data = bytearray(fh.read(count))
                    if data:
                        data[len(data) // 2] ^= 0xFF
                    self.wfile.write(data)
                    sent = len(data)
                else:
                    sent = self.connection.sendfile(fh, start, count)
            self.server.count(self.path.split("?")[0], sent)
            self.wfile.flush()
            if fault and fault[0] == "stall":
                time.sleep(fault[1])
            if fault:
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:  # the client went away (timeout): nothing to do
            self.close_connection = True


if __name__ == "__main__":
    server = RangeServer(Path(sys.argv[1]), int(sys.argv[2]))
    print(server.url, flush=True)
    server.serve_forever()
