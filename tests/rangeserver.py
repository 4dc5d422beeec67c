"""A Range-capable HTTP file server on 127.0.0.1 with fault injection (tests and benchmarks).

Faults are queued per URL path and each one is used by one GET: `("drop", n)` closes the connection after n
body bytes, `("status", code)` answers with that status, `("stall", seconds)` sends a little then goes quiet,
`("ignore_range",)` answers 200 with the whole file. `corrupt` (a set of paths) serves those files with a
flipped byte on every request. Run standalone: `python tests/rangeserver.py ROOT PORT`."""
from __future__ import annotations

import re
import socket
import sys
import threading
import time
from collections import defaultdict, deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class RangeServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, root: Path, port: int = 0) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        self.root = Path(root)
        self.faults: dict[str, deque] = defaultdict(deque)
        self.corrupt: set[str] = set()
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Range header)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def __enter__(self) -> RangeServer:
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
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
        file = srv.root / path.lstrip("/")
        if fault and fault[0] == "status":
            return self._empty(fault[1])
        if not file.is_file():
            return self._empty(404)
        size = file.stat().st_size
        start = 0
        match = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range") or "")
        if match and not (fault and fault[0] == "ignore_range"):
            start = int(match.group(1))
            if start >= size:
                return self._empty(416, {"Content-Range": f"bytes */{size}"})
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(size - start))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        if body:
            self._body(file, start, size, fault, path in srv.corrupt)

    def _empty(self, code: int, headers: dict[str, str] | None = None) -> None:
        self.send_response(code)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _body(self, file: Path, start: int, size: int, fault: tuple | None, corrupt: bool) -> None:
        count = size - start
        if fault and fault[0] == "drop":
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
                else:
                    self.connection.sendfile(fh, start, count)
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
