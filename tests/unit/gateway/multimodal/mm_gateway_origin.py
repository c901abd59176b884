"""A real HTTP origin on 127.0.0.1 serving fixed images, for the gateway multimodal tests.

Every request path is logged, which is how the tests prove that a refused URL was refused
before anything connected to it. (Unique module name: test directories have no packages.)
"""

from __future__ import annotations

import base64
import io
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from PIL import Image

# One copy of the refused-address listener, re-exported for the unit tests.
from tests.integration.image_server import ConnectionCounter as ConnectionCounter


def png_bytes(size: tuple[int, int], seed: int = 0) -> bytes:
    """A small RGB PNG with a seeded gradient, so different seeds give different pixels."""
    width, height = size
    image = Image.new("RGB", size)
    image.putdata(
        [
            ((x * 37 + y * 11 + seed * 53) % 256, (x * 5 + seed * 17) % 256, (y * 9 + seed) % 256)
            for y in range(height)
            for x in range(width)
        ]
    )
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


@dataclass
class OriginState:
    files: dict[str, bytes] = field(default_factory=dict)
    redirects: dict[str, str] = field(default_factory=dict)  # path -> Location (302)
    requests: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def paths(self) -> list[str]:
        with self.lock:
            return list(self.requests)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: ImageOrigin

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        state = self.server.state
        with state.lock:
            state.requests.append(self.path)
            body = state.files.get(self.path)
            location = state.redirects.get(self.path)
        if location is not None:
            self.send_response(302)
            self.send_header("Location", location)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        status = 200 if body is not None else 404
        body = body if body is not None else b"not found"
        self.send_response(status)
        self.send_header("Content-Type", "image/png" if status == 200 else "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class ImageOrigin(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.state = OriginState()
        self._thread = threading.Thread(
            target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"

    def redirect(self, path: str, location: str) -> str:
        """``path`` answers 302 to ``location``; returns the URL of ``path``."""
        with self.state.lock:
            self.state.redirects[path] = location
        return self.url(path)

    def serve(self, path: str, body: bytes) -> str:
        with self.state.lock:
            self.state.files[path] = body
        return self.url(path)

    def start(self) -> ImageOrigin:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
