"""One child of ``tandem gateway --processes N``: ``python -m tandem.gateway.multiprocess.child
CONFIG INDEX PORT LOG_LEVEL EVENT_LOOP``.

The supervisor hands over the whole validated configuration (a pickle in its private
directory, so that a child sees exactly what the supervisor checked, keys included,
without putting them on a command line); the child takes its share of the limits, binds
its SO_REUSEPORT socket and runs as an ordinary gateway. It ends with the supervisor.
"""

from __future__ import annotations

import asyncio
import pickle
import sys
from pathlib import Path

from tandem.parent_watch import follow_parent


def main(argv: list[str]) -> int:
    config_path, index, port, log_level, event_loop = argv
    follow_parent()
    from tandem.log import setup_logging

    setup_logging(log_level, role=f"gateway-{index}")
    from tandem.gateway.torchless import block_torch

    block_torch()  # first, as run_gateway: the gateway never loads torch
    from tandem.gateway.cli import GIL_SWITCH_INTERVAL_S, use_uvloop
    from tandem.gateway.config import GatewayConfig
    from tandem.gateway.multiprocess.shared_limits import child_config
    from tandem.gateway.server import serve

    config = pickle.loads(Path(config_path).read_bytes())
    if not isinstance(config, GatewayConfig):
        raise SystemExit(f"{config_path}: not a gateway configuration")
    config = child_config(config, int(index), int(port))
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)  # as run_gateway, for the same reason
    if use_uvloop(event_loop):  # type: ignore[arg-type]
        import uvloop

        uvloop.run(serve(config, log_level))
    else:
        asyncio.run(serve(config, log_level))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
