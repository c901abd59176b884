"""Children of `tandem serve` end when the launcher does, even when it is SIGKILLed.

The launcher stops its children itself on every orderly exit; this covers the one exit it
cannot handle: being killed outright (``kill -9``, the OOM killer). The launcher names
itself in ``TANDEM_PARENT_PID``; the child then asks the kernel for a SIGTERM when its
parent dies (Linux ``PR_SET_PDEATHSIG``) or, elsewhere, polls its parent pid once a second.
SIGTERM starts the child's ordinary graceful shutdown.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading
import time

from tandem.ascii_int import ascii_int

PARENT_ENV = "TANDEM_PARENT_PID"
_PR_SET_PDEATHSIG = 1
_POLL_S = 1.0

log = logging.getLogger("tandem")


def follow_parent() -> None:
    """Arrange a SIGTERM for this process when the parent named in the environment ends."""
    # Popped, so that anything this process starts in turn does not follow our parent.
    parent = ascii_int(os.environ.pop(PARENT_ENV, ""))
    if parent is None:
        return
    if not _ask_kernel():
        threading.Thread(target=_poll, args=(parent,), name="parent-watch", daemon=True).start()
    # The parent may have died before we asked: the kernel only reports later deaths.
    if os.getppid() != parent:
        _terminate_self()


def _ask_kernel() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _poll(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(_POLL_S)
    _terminate_self()


def _terminate_self() -> None:
    log.warning("the process that started this one is gone; shutting down")
    os.kill(os.getpid(), signal.SIGTERM)
