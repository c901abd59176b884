"""`tandem serve | worker | gateway | models`: parsing only; each command lives in its package."""

from __future__ import annotations

import argparse

from tandem.engine.builtin_cli import add_models_parser
from tandem.gateway.cli import add_gateway_parser
from tandem.parent_watch import follow_parent
from tandem.serve import add_serve_parser
from tandem.worker.cli import add_worker_parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tandem", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    add_serve_parser(commands)
    add_worker_parser(commands)
    add_gateway_parser(commands)
    add_models_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    follow_parent()  # a no-op unless `tandem serve` started us
    return int(args.run(args))


if __name__ == "__main__":
    raise SystemExit(main())
