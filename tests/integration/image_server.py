"""A real HTTP server on 127.0.0.1 that serves generated images and counts requests."""

from __future__ import annotations

import io
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
from PIL import Image


def png_bytes(seed: int, size: tuple[int, int] = (64, 48)) -> bytes:
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, size=(size[1], size[0], 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


class ImageServer:
    """``/img/<seed>.png`` serves a seeded picture; anything else is a 404."""

    def __init__(self) -> None:
        self.hits: Counter[str] = Counter()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server.hits[self.path] += 1
                name = self.path.removeprefix("/img/").removesuffix(".png")
                if not self.path.startswith("/img/") or not name.isdigit():
                    self.send_error(404)
                    return
                body = png_bytes(int(name))
                self.send_response(200)
                self.send_header("Content-Type", "image/png")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                return

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def url(self, seed: int) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/img/{seed}.png"

    def __enter__(self) -> ImageServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
