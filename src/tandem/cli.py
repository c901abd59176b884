"""`tandem worker | gateway | serve`: argument parsing only; each command lives in its package."""

from __future__ import annotations

import argparse
import sys

from tandem.gateway.cli import add_gateway_parser
from tandem.worker.cli import add_worker_parser


def _serve(_: argparse.Namespace) -> int:
    # The one-command deployment (gateway + prefill + decode workers) is still being built;
    # say plainly what exists instead of pretending.
    print(
        "tandem serve: not available yet. What exists today: the wire contract helpers "
        "(tandem.wire) and the error model (tandem.errors); the embedded worker and the "
        "gateway are in progress. Run `make test` to exercise what is built.",
        file=sys.stderr,
    )
    return 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tandem", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="gateway + prefill + decode workers in one command")
    serve.set_defaults(run=_serve)
    add_worker_parser(commands)
    add_gateway_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    raise SystemExit(main())
