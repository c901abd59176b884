"""A flag's default is its config field's default, and its choices are the field's Literal.

The CLIs read both from the config dataclasses and the types modules instead of repeating
them, so these tests only break when a flag stops doing so (or converts a unit wrongly).
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any, get_args, get_type_hints

import pytest

from tandem.cli import build_parser
from tandem.gateway.cli import config_from_args as gateway_config_from_args
from tandem.gateway.config import GatewayConfig
from tandem.gateway.types import (
    EventLoop,
    HistoryBackend,
    MmProcessingMode,
    PdDispatch,
    WorkerStreamClient,
)
from tandem.log import DEFAULT_LOG_LEVEL
from tandem.worker.cli import MmProcessor
from tandem.worker.cli import config_from_args as worker_config_from_args
from tandem.worker.config import EngineKind, KvConnector, Role, WorkerConfig


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


def differing_fields(built: Any, default: Any) -> dict[str, tuple[Any, Any]]:
    """Field → (from the flags, the dataclass's default), for the fields that differ."""
    return {
        f.name: (getattr(built, f.name), getattr(default, f.name))
        for f in dataclasses.fields(default)
        if getattr(built, f.name) != getattr(default, f.name)
    }


def test_gateway_flags_default_to_the_gateway_config() -> None:
    # No gateway field needs an argument: a gateway with no workers is a valid config.
    built = gateway_config_from_args(parse("gateway"))
    assert differing_fields(built, GatewayConfig()) == {}
    assert built == GatewayConfig()


def test_worker_flags_default_to_the_worker_config() -> None:
    # Covers the unit conversions too: --null-token-delay-ms → null_token_delay_s.
    built = worker_config_from_args(parse("worker"))
    assert differing_fields(built, WorkerConfig()) == {}
    assert built == WorkerConfig()


def test_serve_flags_default_to_what_its_children_default_to() -> None:
    args = parse("serve")
    assert args.model == WorkerConfig().model
    assert args.port == GatewayConfig().port
    assert args.mm_processing == GatewayConfig().mm_processing
    assert args.worker_stream_client == GatewayConfig().worker_stream_client
    assert args.history_backend == GatewayConfig().history_backend
    assert args.history_sqlite_path == GatewayConfig().history_sqlite_path
    assert args.log_level == DEFAULT_LOG_LEVEL
    for command in ("gateway", "worker"):
        assert parse(command).log_level == DEFAULT_LOG_LEVEL


def choices(command: str, flag: str) -> tuple[Any, ...]:
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    sub = commands.choices[command]
    action = next(a for a in sub._actions if flag in a.option_strings)
    assert action.choices is not None, flag
    return tuple(action.choices)


@pytest.mark.parametrize(
    ("command", "flag", "literal"),
    [
        ("gateway", "--mm-processing", MmProcessingMode),
        ("gateway", "--pd-dispatch", PdDispatch),
        ("gateway", "--event-loop", EventLoop),
        ("gateway", "--history-backend", HistoryBackend),
        ("serve", "--history-backend", HistoryBackend),
        ("serve", "--mm-processing", MmProcessingMode),
        ("gateway", "--worker-stream-client", WorkerStreamClient),
        ("serve", "--worker-stream-client", WorkerStreamClient),
        ("worker", "--role", Role),
        ("worker", "--engine", EngineKind),
        ("worker", "--kv-connector", KvConnector),
        ("worker", "--mm-processor", MmProcessor),
    ],
)
def test_choices_are_the_literal_of_the_field(command: str, flag: str, literal: Any) -> None:
    assert choices(command, flag) == get_args(literal)


@pytest.mark.parametrize(
    ("config", "name", "literal"),
    [
        (GatewayConfig, "mm_processing", MmProcessingMode),
        (GatewayConfig, "pd_dispatch", PdDispatch),
        (GatewayConfig, "history_backend", HistoryBackend),
        (GatewayConfig, "worker_stream_client", WorkerStreamClient),
        (WorkerConfig, "role", Role),
        (WorkerConfig, "engine", EngineKind),
        (WorkerConfig, "kv_connector", KvConnector),
    ],
)
def test_config_fields_are_typed_by_the_same_literal(config: type, name: str, literal: Any) -> None:
    assert get_type_hints(config)[name] == literal


def test_serve_passes_its_gateway_flags_on() -> None:
    """The argv `tandem serve` starts its gateway with parses to the flags it was given."""
    from tandem.serve.children import Child
    from tandem.serve.launcher import Plan

    args = parse("serve", "--worker-stream-client", "grpcio", "--mm-processing", "router")
    plan = Plan(
        model="tiny-qwen3-vl",
        prefill=1,
        decode=1,
        aggregated=False,
        decode_language_model_only=False,
        mm_processing=args.mm_processing,
        worker_stream_client=args.worker_stream_client,
        port=0,
        log_level="info",
        image=Path("unused.png"),
    )
    workers = []
    for role, address in (("prefill-0", "127.0.0.1:1"), ("decode-0", "127.0.0.1:2")):
        child = Child(role, [], None, None)  # type: ignore[arg-type]  # never started
        child.address = address
        workers.append(child)
    built = gateway_config_from_args(parse(*plan.gateway_args(workers)))
    assert built.worker_stream_client == "grpcio"
    assert built.mm_processing == "router"
