"""A static file server for 127.0.0.1 that answers single `bytes=a-b` / `bytes=a-` ranges (what fsspec's HTTP
filesystem sends; RangeServer in servers.py adds fault injection) and logs (path, Range header).

    python -m tests.helpers.range_files ROOT [PORT [MB_PER_S]]   # prints the URL, serves until killed (benchmarks)

MB_PER_S > 0 caps each response's rate (a slow link, for read-ahead measurements)."""
from __future__ import annotations

import re
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class RangeFiles(SimpleHTTPRequestHandler):
    log: list[tuple[str, str | None]] = []
    mb_per_s: float = 0.0

    def log_message(self, *args: object) -> None:
        pass

    def send_head(self):  # type: ignore[override]
        path = Path(self.translate_path(self.path))
        type(self).log.append((self.path, self.headers.get("Range")))
        if not path.is_file():
            self.send_error(404)
            return None
        size = path.stat().st_size
        fh = open(path, "rb")
        match = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range") or "")
        if match:
            start, end = int(match[1]), min(int(match[2] or size - 1), size - 1)
            fh.seek(start)
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
            self.range_left = end - start + 1
        else:
            self.send_response(200)
            self.range_left = size
        self.send_header("Content-Length", str(self.range_left))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        return fh

    def copyfile(self, source, outputfile) -> None:  # type: ignore[override]
        left = self.range_left
        while left > 0:
            chunk = source.read(min(left, 1 << 20))
            if not chunk:
                break
            outputfile.write(chunk)
            left -= len(chunk)
            if self.mb_per_s > 0:
                time.sleep(len(chunk) / (self.mb_per_s * 1e6))


def make_server(root: Path, port: int = 0, mb_per_s: float = 0.0
                ) -> tuple[ThreadingHTTPServer, list[tuple[str, str | None]]]:
    handler = type("Handler", (RangeFiles,), {"log": [], "mb_per_s": mb_per_s})
    server = ThreadingHTTPServer(("127.0.0.1", port), lambda *a: handler(*a, directory=str(root)))
    server.daemon_threads = True
    return server, handler.log


@contextmanager
def serving(root: Path) -> Iterator[tuple[str, list[tuple[str, str | None]]]]:
    """(URL, request log) of a server for `root` running in a thread."""
    server, log = make_server(root)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", log
    finally:
        server.shutdown()
        server.server_close()


if __name__ == "__main__":
    srv, _ = make_server(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 0,
                         float(sys.argv[3]) if len(sys.argv) > 3 else 0.0)
    print(f"http://127.0.0.1:{srv.server_address[1]}", flush=True)
    srv.serve_forever()
