"""How the limits of one gateway are shared out among the processes of ``--processes N``.

Each limit is split, not shared through cross-process counters: child ``i`` of ``N`` gets
``total // N``, and the first ``total % N`` children one more, so the children's shares add
up to the configured total exactly and the gateway as a whole never runs more than it.
Why a split: every admission decision stays a plain integer on the child's own event
loop (no lock or shared memory on the request path, no counter left wrong by a child that
is killed while holding slots). The cost: the kernel hands connections to children by a
hash, not by load, so one child may refuse (429) while another still has room; under a
steady load the kernel's spread is even and the difference is small.

- ``--max-concurrent-requests``: split; a positive limit below N is refused at start-up
  (a child with no slot would turn the bound off, one with a forced slot would break it).
- ``--max-queued-requests``: split (a child's share may be 0: it refuses at once).
- ``--multimodal-max-inflight-bytes``: split, at least 1 byte where the total is on (a
  single request above one child's share is refused 413: the whole budget is the bound).
- ``--mm-pixel-cache-mb``: split, at least 1 MiB where the cache is on (the memory bound
  stays the one gateway's; each child caches the images of its own connections, so an image
  re-sent on another connection may miss once in a child that has not seen it).
- ``--mm-workers``: split, at least 1 pool process per child where the total is above 0.

Stored responses need no split: sqlite (WAL, one file) and postgres are shared by every
child, so a Responses chain may continue on any of them; ``--history-backend memory`` is
refused with N > 1 (gateway/config.py).
"""

from __future__ import annotations

import dataclasses

from tandem.gateway.config import GatewayConfig


def share(total: int, index: int, processes: int, *, at_least_one: bool = False) -> int:
    """Child ``index``'s part of ``total`` (0 stays 0: a bound that is off stays off)."""
    base, extra = divmod(total, processes)
    part = base + (1 if index < extra else 0)
    if at_least_one and total > 0:
        part = max(1, part)
    return part


def check_shares(config: GatewayConfig) -> None:
    """Refuse limits that cannot be split over ``config.processes`` children."""
    n = config.processes
    if 0 < config.max_concurrent_requests < n:
        raise ValueError(
            f"--processes {n}: --max-concurrent-requests={config.max_concurrent_requests} "
            "cannot be split into one slot or more per process; raise it or lower --processes"
        )


def child_config(config: GatewayConfig, index: int, port: int) -> GatewayConfig:
    """The configuration of child ``index``: the supervisor's port and its share of limits."""
    n = config.processes
    return dataclasses.replace(
        config,
        port=port,
        max_concurrent_requests=share(config.max_concurrent_requests, index, n),
        max_queued_requests=share(config.max_queued_requests, index, n),
        mm_max_inflight_bytes=share(config.mm_max_inflight_bytes, index, n, at_least_one=True),
        mm_pixel_cache_mb=share(config.mm_pixel_cache_mb, index, n, at_least_one=True),
        mm_workers=share(config.mm_workers, index, n, at_least_one=True),
    )
