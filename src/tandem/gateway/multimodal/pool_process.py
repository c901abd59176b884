"""One image pool process, and the socket the gateway's event loop talks to it over.

No thread on the gateway's side: the loop writes each task frame to a non-blocking socket
and reads the answers when the socket is readable, so sending an image to the pool costs
the loop one small write and never waits for the GIL behind a helper thread (what
``ProcessPoolExecutor``'s feeder and manager threads made it do, milliseconds at a time,
while every other stream's tokens waited). The image's bytes travel through a /dev/shm
file, not the socket, so a frame stays a few hundred bytes.

Frames use ``multiprocessing.Connection``'s framing (a signed big-endian 32-bit length,
then a pickle), so the pool process reads and answers with plain blocking
``recv_bytes``/``send_bytes`` (pool_worker.serve).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pickle
import struct
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.context import ForkServerContext
from multiprocessing.process import BaseProcess

from tandem.gateway.multimodal.pool_worker import WarmUp, serve

_HEADER = struct.Struct("!i")
_READ_CHUNK = 1 << 16
_WARM_TIMEOUT_S = 120.0

OnAnswer = Callable[[int, object], None]
OnDeath = Callable[[], None]


class PoolProcess:
    """A started pool process; :meth:`attach` hands its socket to the running loop."""

    def __init__(self, context: ForkServerContext, index: int, nice: int = 0) -> None:
        self.index = index
        self.torch_loaded = False
        parent, child = context.Pipe(duplex=True)
        self._conn: Connection = parent
        self._process: BaseProcess = context.Process(
            target=serve, args=(child, nice), name=f"tandem-mmpool-{index}", daemon=True
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._out = bytearray()
        self._in = bytearray()
        self._writing = False
        self._dead = False
        self._on_answer: OnAnswer | None = None
        self._on_death: OnDeath | None = None
        try:
            self._process.start()
        finally:
            child.close()

    @property
    def pid(self) -> int:
        return int(self._process.pid or 0)

    def warm_blocking(self) -> None:
        """Before :meth:`attach`, blocking (off the loop): the first round trip."""
        self._conn.send_bytes(pickle.dumps((0, WarmUp())))
        if not self._conn.poll(_WARM_TIMEOUT_S):
            raise RuntimeError(f"image pool process {self.index} did not start")
        _, loaded = pickle.loads(self._conn.recv_bytes())
        self.torch_loaded = bool(loaded)

    def attach(
        self, loop: asyncio.AbstractEventLoop, on_answer: OnAnswer, on_death: OnDeath
    ) -> None:
        """From now on answers reach ``on_answer`` and an exit ``on_death``, on ``loop``."""
        self._loop, self._on_answer, self._on_death = loop, on_answer, on_death
        os.set_blocking(self._conn.fileno(), False)
        loop.add_reader(self._conn.fileno(), self._readable)
        # The sentinel becomes readable when the process exits, however it exits.
        loop.add_reader(self._process.sentinel, self._died)

    def send(self, task_id: int, message: object) -> None:
        """Queue one frame; written now if the socket takes it, else when it drains."""
        if self._dead:
            return  # its tasks are being failed by _died
        payload = pickle.dumps((task_id, message), protocol=pickle.HIGHEST_PROTOCOL)
        self._out += _HEADER.pack(len(payload))
        self._out += payload
        self._flush()

    def _flush(self) -> None:
        assert self._loop is not None
        try:
            written = os.write(self._conn.fileno(), self._out)
        except BlockingIOError:
            written = 0
        except OSError:
            self._died()
            return
        del self._out[:written]
        if self._out and not self._writing:
            self._loop.add_writer(self._conn.fileno(), self._flush)
            self._writing = True
        elif not self._out and self._writing:
            self._loop.remove_writer(self._conn.fileno())
            self._writing = False

    def _readable(self) -> None:
        try:
            chunk = os.read(self._conn.fileno(), _READ_CHUNK)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._died()  # EOF: the process is gone (the sentinel may not have fired yet)
            return
        self._in += chunk
        while len(self._in) >= _HEADER.size:
            (size,) = _HEADER.unpack_from(self._in)
            end = _HEADER.size + size
            if len(self._in) < end:
                break
            # A slice of a bytearray is a copy (a few KiB): no buffer export outlives it.
            task_id, answer = pickle.loads(self._in[_HEADER.size : end])
            del self._in[:end]
            assert self._on_answer is not None
            self._on_answer(task_id, answer)
            if self._dead:
                return

    def _died(self) -> None:
        if self._dead:
            return
        self._dead = True
        self._detach()
        if self._on_death is not None:
            self._on_death()

    def _detach(self) -> None:
        if self._loop is not None and not self._loop.is_closed():
            with contextlib.suppress(ValueError, OSError):
                self._loop.remove_reader(self._conn.fileno())
                self._loop.remove_writer(self._conn.fileno())
            with contextlib.suppress(ValueError, OSError):
                self._loop.remove_reader(self._process.sentinel)
        with contextlib.suppress(OSError):
            self._conn.close()

    def close(self) -> None:
        """Detach from the loop and close the socket: the process reads EOF and exits."""
        self._dead = True
        self._detach()

    def join_blocking(self, timeout_s: float = 5.0) -> None:
        """After :meth:`close` (off the loop): wait for the exit, kill a process that hangs."""
        self._process.join(timeout_s)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(timeout_s)
        with contextlib.suppress(ValueError):
            self._process.close()
