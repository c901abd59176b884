"""The gateway's access-control flags (docs/operations.md, "Access control")."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

from tandem.gateway.auth import parse_control_plane_key, parse_tenant_key
from tandem.gateway.config import GatewayConfig

T = TypeVar("T")


def _default(name: str) -> Any:
    return next(f.default for f in dataclasses.fields(GatewayConfig) if f.name == name)


def _argument_type(parse: Callable[[str], T]) -> Callable[[str], T]:
    """argparse reports a ValueError with the value itself; a key must never be echoed."""

    def convert(spec: str) -> T:
        try:
            return parse(spec)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = parse.__name__
    return convert


def add_access_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--api-key",
        default=_default("api_key"),
        help="clients of /v1/* must send 'Authorization: Bearer KEY'",
    )
    p.add_argument(
        "--tenant-api-key",
        action="append",
        type=_argument_type(parse_tenant_key),
        metavar="TENANT:KEY",
        help="another /v1/* key, naming the tenant its requests belong to (repeatable)",
    )
    p.add_argument(
        "--control-plane-api-keys",
        nargs="+",
        action="append",
        type=_argument_type(parse_control_plane_key),
        metavar="ID:NAME:ROLE:KEY",
        help="keys of the worker admin API; role user may list, admin may also add/remove",
    )


def access_config_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The GatewayConfig fields the access flags set."""
    return {
        "api_key": args.api_key,
        "tenant_api_keys": list(args.tenant_api_key or []),
        "control_plane_api_keys": [k for group in args.control_plane_api_keys or [] for k in group],
    }
