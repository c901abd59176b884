"""SGLang's ``GenerateResponse`` frames read into the gateway's :class:`Frame`: the shape
every scheduler protocol shares (``backends/scheduler/frames.py``)."""

from __future__ import annotations

from tandem.gateway.backends.scheduler.frames import scheduler_frame as frame_of

__all__ = ["frame_of"]
