"""`tandem worker` flags → WorkerConfig."""

from __future__ import annotations

import argparse
import asyncio
from typing import Literal, get_args

from tandem.log import DEFAULT_LOG_LEVEL, setup_logging
from tandem.media.flags import add_media_flags, media_policy_from_args
from tandem.process_exit import exit_without_teardown
from tandem.worker.config import (
    ENGINES,
    JSON_WHITESPACE,
    KV_CONNECTORS,
    PROTOCOLS,
    ROLES,
    WorkerConfig,
)
from tandem.worker.media_limits import add_media_limit_flags, media_limits_from_args

# --mm-processor: WorkerConfig.mm_processor as a word (True: "inprocess").
MmProcessor = Literal["inprocess", "off"]
MM_PROCESSORS: tuple[MmProcessor, ...] = get_args(MmProcessor)
# Every flag's default is the config's own (tests/unit/test_cli_defaults.py checks it).
_DEFAULTS = WorkerConfig()


def add_worker_parser(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "worker",
        help="a gRPC worker (vLLM, SGLang, TokenSpeed, TensorRT-LLM or MLX protocol) over the "
        "embedded engine",
    )
    p.add_argument("--model", default=_DEFAULTS.model, help="built-in name or checkpoint dir")
    p.add_argument(
        "--protocol",
        choices=PROTOCOLS,
        default=_DEFAULTS.protocol,
        help="the worker protocol served: vllm (vllm.grpc.engine.VllmEngine), sglang "
        "(sglang.grpc.scheduler.SglangScheduler), tokenspeed "
        "(tokenspeed.grpc.scheduler.TokenSpeedScheduler), trtllm (trtllm.TrtllmService) or mlx "
        "(mlx.grpc.engine.MlxEngine; these two serve --role both only)",
    )
    p.add_argument("--served-model-name", default=_DEFAULTS.served_model_name)
    p.add_argument("--host", default=_DEFAULTS.host, help="bind address")
    p.add_argument("--port", type=int, default=_DEFAULTS.port, help="0 picks a free port")
    p.add_argument(
        "--advertise-host",
        default=_DEFAULTS.advertise_host,
        help="the host others dial (KV params, READY line); default --host, "
        "required when --host is a wildcard (0.0.0.0, ::)",
    )
    p.add_argument(
        "--role",
        choices=ROLES,
        default=_DEFAULTS.role,
        help="the legs served: both (aggregated), prefill, decode; encode: a TokenSpeed "
        "E/P/D encode worker (--protocol tokenspeed, --engine embedded)",
    )
    p.add_argument(
        "--disaggregation-bootstrap-port",
        type=int,
        default=_DEFAULTS.bootstrap_port,
        help="--protocol sglang or tokenspeed: also listen on this port, where decode workers "
        "reach the KV of PD requests (the bootstrap port gateways send); default: the gRPC port",
    )
    p.add_argument(
        "--language-model-only",
        action="store_true",
        help="load no vision tower; report supports_vision=false",
    )
    p.add_argument(
        "--mm-processor",
        choices=MM_PROCESSORS,
        default="inprocess" if _DEFAULTS.mm_processor else "off",
    )
    add_media_flags(p)
    add_media_limit_flags(p)
    p.add_argument("--kv-lease-secs", type=float, default=_DEFAULTS.kv_lease_s)
    p.add_argument(
        "--kv-pull-wait-secs",
        type=float,
        default=_DEFAULTS.kv_pull_wait_s,
        help="how long a decode leg waits for its prefill's KV to appear before it fails "
        "UNAVAILABLE",
    )
    p.add_argument(
        "--kv-events-heartbeat-secs",
        type=float,
        default=_DEFAULTS.kv_events_heartbeat_s,
        help="how often the KV-event stream carries the worker's load while nothing else goes",
    )
    p.add_argument(
        "--no-kv-events",
        dest="kv_events",
        action="store_false",
        help="publish no KV events (SubscribeKvEvents answers UNIMPLEMENTED)",
    )
    p.add_argument(
        "--embedding-cache-mb",
        type=int,
        default=_DEFAULTS.embedding_cache_mb,
        help="--role encode: memory for image features kept by their pixels' digest, so a "
        "repeated image is encoded once (0: off)",
    )
    p.add_argument("--kv-connector", choices=KV_CONNECTORS, default=_DEFAULTS.kv_connector)
    p.add_argument("--prefix-cache-bytes", type=int, default=_DEFAULTS.prefix_cache_bytes)
    p.add_argument(
        "--json-whitespace",
        choices=JSON_WHITESPACE,
        default=_DEFAULTS.json_whitespace,
        help="JSON grammars (schemas, forced tool calls): compact, or any whitespace between "
        "tokens as vLLM allows by default (a model may then pad until max_tokens)",
    )
    p.add_argument("--threads", type=int, default=_DEFAULTS.threads, help="torch intra-op threads")
    p.add_argument("--log-level", default=DEFAULT_LOG_LEVEL)
    p.add_argument(
        "--engine",
        choices=ENGINES,
        default=_DEFAULTS.engine,
        help="null: canned tokens at once, no model weights (for gateway benchmarks)",
    )
    p.add_argument(
        "--null-token-delay-ms",
        type=float,
        default=_DEFAULTS.null_token_delay_s * 1000.0,
        help="null engine: pause before each token (a slow worker)",
    )
    p.add_argument(
        "--test-only-advertise-as-vllm",
        action="store_true",
        help="for tests: do not advertise as a Tandem worker, so gateways treat this worker "
        "as a vLLM worker that enforces no Tandem media policy",
    )
    p.set_defaults(run=run_worker)


def config_from_args(args: argparse.Namespace) -> WorkerConfig:
    media = media_policy_from_args(args)
    return WorkerConfig(
        model=args.model,
        protocol=args.protocol,
        served_model_name=args.served_model_name,
        host=args.host,
        port=args.port,
        advertise_host=args.advertise_host,
        role=args.role,
        bootstrap_port=args.disaggregation_bootstrap_port,
        language_model_only=args.language_model_only,
        mm_processor=args.mm_processor == "inprocess",
        media=media,
        media_limits=media_limits_from_args(args),
        kv_lease_s=args.kv_lease_secs,
        kv_pull_wait_s=args.kv_pull_wait_secs,
        kv_events=args.kv_events,
        kv_events_heartbeat_s=args.kv_events_heartbeat_secs,
        embedding_cache_mb=args.embedding_cache_mb,
        kv_connector=args.kv_connector,
        prefix_cache_bytes=args.prefix_cache_bytes,
        threads=args.threads,
        json_whitespace=args.json_whitespace,
        engine=args.engine,
        null_token_delay_s=args.null_token_delay_ms / 1000.0,
        test_only_advertise_as_vllm=args.test_only_advertise_as_vllm,
    )


def run_worker(args: argparse.Namespace) -> int:
    setup_logging(args.log_level, role=f"worker:{args.role}")
    try:
        config = config_from_args(args)
    except ValueError as exc:  # a bad flag: say which, no stack trace
        raise SystemExit(f"tandem worker: error: {exc}") from None
    from tandem.worker.server import serve  # torch loads only for this command

    asyncio.run(serve(config))
    # Shut down cleanly by now; the interpreter's own teardown would take seconds more.
    exit_without_teardown(0)
