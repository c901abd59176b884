"""A real HTTP origin on 127.0.0.1 for the media fetch tests, plus small image helpers.

Kept out of conftest.py under a unique module name so that test modules can import the
types and constants without importing "conftest" (ambiguous when several directories have
one).

The server runs in a thread (ThreadingHTTPServer) so the asyncio client under test talks to
it over a real socket. Every request is logged, which is how the tests prove that a refused
URL was refused before anything connected.
"""

from __future__ import annotations

import io
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from PIL import Image

HUGE_TOTAL = 64 * 1024 * 1024
_CHUNK = 64 * 1024


def make_image_bytes(fmt: str = "PNG", size: tuple[int, int] = (8, 6), mode: str = "RGB") -> bytes:
    image = Image.new(mode, size)
    # A gradient, so that a decoder bug that loses or scrambles pixels changes the result.
    for x in range(size[0]):
        for y in range(size[1]):
            value = (x * 37 + y * 11) % 256
            if mode == "RGB":
                image.putpixel((x, y), (value, 255 - value, (value * 3) % 256))
            elif mode == "RGBA":
                image.putpixel((x, y), (value, 255 - value, 7, 128))
            else:
                image.putpixel((x, y), value)
    out = io.BytesIO()
    image.save(out, format=fmt)
    return out.getvalue()


@dataclass
class ServerState:
    png: bytes = field(default_factory=make_image_bytes)
    requests: list[tuple[str, str]] = field(default_factory=list)
    huge_written: int = 0
    huge_done: threading.Event = field(default_factory=threading.Event)
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def paths(self) -> list[str]:
        with self.lock:
            return [path for path, _ in self.requests]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: OriginServer

    def log_message(self, format: str, *args: object) -> None:
        pass  # keep test output clean

    def do_GET(self) -> None:
        state = self.server.state
        with state.lock:
            state.requests.append((self.path, self.headers.get("Host", "")))
        parts = urlsplit(self.path)
        route, query = parts.path, parse_qs(parts.query)
        if route == "/img.png":
            self._send(200, state.png, "image/png")
        elif route == "/redirect-self":
            self._redirect("/img.png")
        elif route.startswith("/loop/"):
            self._redirect(f"/loop/{int(route.rsplit('/', 1)[1]) + 1}")
        elif route.startswith("/chain/"):
            left = int(route.rsplit("/", 1)[1])
            self._redirect(f"/chain/{left - 1}" if left > 0 else "/img.png")
        elif route == "/redirect-to":
            self._redirect(query["url"][0])
        elif route.startswith("/status/"):
            self._send(int(route.rsplit("/", 1)[1]), b"nope", "text/plain")
        elif route == "/declared-huge":
            self.send_response(200)
            self.send_header("Content-Length", str(1024 * 1024 * 1024))
            self.end_headers()
            self.wfile.write(b"x" * 16)
            self.close_connection = True
        elif route == "/huge":
            self._huge()
        elif route == "/slow":
            state.stop.wait(3.0)
            self._send(200, state.png, "image/png")
        elif route == "/drip":
            self._drip()
        elif route == "/gzip":
            self.send_response(200)
            self.send_header("Content-Length", "4")
            self.send_header("Content-Encoding", "gzip")
            self.end_headers()
            self.wfile.write(b"abcd")
        else:
            self._send(404, b"not found", "text/plain")

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _redirect(self, location: str) -> None:
        self.send_response(302)
        self.send_header("Location", location)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _huge(self) -> None:
        # No Content-Length: the client can only stop this by counting bytes as they arrive.
        state = self.server.state
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        chunk = b"\0" * _CHUNK
        written = 0
        try:
            while written < HUGE_TOTAL and not state.stop.is_set():
                self.wfile.write(chunk)
                written += len(chunk)
        except OSError:
            pass  # the client hung up, which is what the test wants
        finally:
            state.huge_written = written
            state.huge_done.set()

    def _drip(self) -> None:
        # Each byte arrives well within the read timeout; only a total budget stops this.
        state = self.server.state
        self.send_response(200)
        self.send_header("Content-Length", "1000")
        self.end_headers()
        try:
            for _ in range(1000):
                if state.stop.wait(0.05):
                    break
                self.wfile.write(b"x")
                self.wfile.flush()
        except OSError:
            pass
        self.close_connection = True


class OriginServer(ThreadingHTTPServer):
    daemon_threads = True
    state: ServerState


@dataclass
class LoopbackOrigin:
    state: ServerState
    port: int

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"


def start_origin() -> OriginServer:
    server = OriginServer(("127.0.0.1", 0), _Handler)
    server.state = ServerState()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
