"""A real HTTP server on 127.0.0.1 that serves generated images and counts requests."""

from __future__ import annotations

import base64
import io
import random
import socket
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
from PIL import Image

from tandem.engine.builtin_shapes import COLOURS, SHAPES, draw


def shape_of(seed: int) -> tuple[str, str]:
    """The colour and shape of picture ``seed``: consecutive seeds differ in colour, and
    seeds ``k`` and ``k + 6`` in shape only, so two seeds a test picks look different to the
    built-in models (engine/builtin_shapes.py) unless they are 18 apart."""
    colours = list(COLOURS)
    return colours[seed % len(colours)], SHAPES[(seed // len(colours)) % len(SHAPES)]


def png_bytes(seed: int, size: tuple[int, int] = (112, 96)) -> bytes:
    """A picture the built-in models were trained to read: ``shape_of(seed)``, drawn with a
    seeded position and colour jitter, so every seed has bytes (and a hash) of its own.

    The default size is within the training pictures' (96 to 160 a side); much smaller ones
    are read less reliably (a 64x48 picture is four tokens for tiny-qwen3-vl)."""
    colour, shape = shape_of(seed)
    return draw(colour, shape, size, random.Random(seed)).png()


def noise_png_bytes(seed: int, size: tuple[int, int] = (64, 48)) -> bytes:
    """Random pixels: a PNG that does not compress (for byte-size limits)."""
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, size=(size[1], size[0], 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def image_messages(seed: int) -> list[dict]:
    """One user turn: the PNG of ``seed`` as a data URL, then a question."""
    url = "data:image/png;base64," + base64.b64encode(png_bytes(seed)).decode()
    return [
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": url}},
                {"type": "text", "text": "What do you see?"},
            ],
        }
    ]


class ImageServer:
    """``/img/<seed>.png`` serves a seeded picture, a path in ``redirects`` answers 302 to its
    target, a path given to :meth:`serve` its bytes; anything else is a 404."""

    def __init__(self) -> None:
        self.hits: Counter[str] = Counter()
        self.redirects: dict[str, str] = {}
        self.files: dict[str, tuple[str, bytes]] = {}  # path -> (content type, body)
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server.hits[self.path] += 1
                location = server.redirects.get(self.path)
                if location is not None:
                    self.send_response(302)
                    self.send_header("Location", location)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                content_type, body = server.files.get(self.path, ("image/png", b""))
                if not body:
                    name = self.path.removeprefix("/img/").removesuffix(".png")
                    if not self.path.startswith("/img/") or not name.isdigit():
                        self.send_error(404)
                        return
                    body = png_bytes(int(name))
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                return

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def url(self, seed: int, host: str = "127.0.0.1") -> str:
        return self.path_url(f"/img/{seed}.png", host)

    def serve(self, path: str, body: bytes, content_type: str) -> str:
        """Answer ``path`` with ``body`` from now on; its URL."""
        self.files[path] = (content_type, body)
        return self.path_url(path)

    def path_url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.httpd.server_address[1]}{path}"

    def __enter__(self) -> ImageServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class ConnectionCounter:
    """A TCP listener on 127.0.0.1 that counts the connections it accepts, then drops them.

    Stands for an address the media policy refuses: a test asserts that it saw none.
    """

    def __init__(self) -> None:
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.05)
        self.connections = 0
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)

    @property
    def port(self) -> int:
        return int(self._sock.getsockname()[1])

    def url(self, path: str = "/secret.png") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            conn.close()

    def start(self) -> ConnectionCounter:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(2)
        self._sock.close()

    def __enter__(self) -> ConnectionCounter:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
