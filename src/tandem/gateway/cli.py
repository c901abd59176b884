"""`tandem gateway` flags → GatewayConfig. Names follow smg's where the feature is the same."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from tandem.gateway.auth_flags import access_config_from_args, add_access_flags
from tandem.gateway.config import (
    MM_MAX_INFLIGHT_BYTES,
    MM_PROCESSING_MODES,
    PD_DISPATCH_MODES,
    GatewayConfig,
)
from tandem.hostport import bare_host, canonical_address
from tandem.log import setup_logging
from tandem.media.flags import add_media_flags, media_policy_from_args


def _urls(values: list[str] | None) -> list[str]:
    # One spelling per worker (IPv6 in brackets); a malformed address fails here, by name.
    return [canonical_address(u, "grpc") for group in values or [] for u in group]


def add_gateway_parser(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("gateway", help="the OpenAI-compatible gateway")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--worker-urls", nargs="+", action="append", help="aggregated workers")
    p.add_argument("--pd-disaggregation", action="store_true")
    p.add_argument("--prefill", nargs="+", action="append", help="prefill worker URLs")
    p.add_argument("--decode", nargs="+", action="append", help="decode worker URLs")
    p.add_argument("--policy", default="cache_aware")
    p.add_argument("--prefill-policy", default=None)
    p.add_argument("--decode-policy", default=None)
    p.add_argument("--pd-dispatch", choices=PD_DISPATCH_MODES, default="sequential")
    p.add_argument("--model-path", type=Path, default=None)
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--mm-processing", choices=MM_PROCESSING_MODES, default="auto")
    p.add_argument("--mm-per-request-image-limit", type=int, default=8)
    add_media_flags(p)
    p.add_argument("--max-payload-size", type=int, default=64 << 20)
    p.add_argument("--request-timeout-secs", type=float, default=300.0)
    p.add_argument("--max-retries", type=int, default=2)
    p.add_argument("--health-check-interval-secs", type=float, default=5.0)
    p.add_argument(
        "--health-check-timeout-secs",
        type=float,
        default=2.0,
        help="deadline of one HealthCheck call",
    )
    p.add_argument(
        "--health-failure-threshold",
        type=int,
        default=2,
        help="failed health checks in a row before a worker leaves the pool",
    )
    p.add_argument(
        "--multimodal-max-inflight-bytes",
        type=int,
        default=MM_MAX_INFLIGHT_BYTES,
        help="image bytes (decoded, then pixel tensors) all in-flight requests may hold "
        "(0: no limit)",
    )
    p.add_argument(
        "--max-concurrent-requests",
        type=int,
        default=256,
        help="generation requests processed at once (0: no limit)",
    )
    p.add_argument(
        "--max-queued-requests",
        type=int,
        default=512,
        help="requests waiting for a slot beyond --max-concurrent-requests; more get 429",
    )
    p.add_argument(
        "--drain-timeout-secs",
        type=float,
        default=30.0,
        help="on SIGTERM, how long in-flight requests may take to finish",
    )
    p.add_argument(
        "--event-loop",
        choices=("auto", "uvloop", "asyncio"),
        default="auto",
        help="auto: uvloop when installed (less gateway CPU per request than asyncio's loop)",
    )
    add_access_flags(p)
    p.add_argument("--log-level", default="info")
    p.add_argument(
        "--no-access-log",
        dest="access_log",
        action="store_false",
        help="no per-request log line (the request metrics stay)",
    )
    p.set_defaults(run=run_gateway)


def config_from_args(args: argparse.Namespace) -> GatewayConfig:
    media = media_policy_from_args(args)
    return GatewayConfig(
        host=bare_host(args.host),
        port=args.port,
        worker_urls=_urls(args.worker_urls),
        pd_disaggregation=args.pd_disaggregation,
        prefill_urls=_urls(args.prefill),
        decode_urls=_urls(args.decode),
        policy=args.policy,
        prefill_policy=args.prefill_policy,
        decode_policy=args.decode_policy,
        pd_dispatch=args.pd_dispatch,
        model_path=args.model_path,
        served_model_name=args.served_model_name,
        mm_processing=args.mm_processing,
        mm_per_request_image_limit=args.mm_per_request_image_limit,
        media=media,
        max_payload_size=args.max_payload_size,
        request_timeout_s=args.request_timeout_secs,
        max_retries=args.max_retries,
        health_interval_s=args.health_check_interval_secs,
        health_timeout_s=args.health_check_timeout_secs,
        health_failure_threshold=args.health_failure_threshold,
        mm_max_inflight_bytes=args.multimodal_max_inflight_bytes,
        max_concurrent_requests=args.max_concurrent_requests,
        max_queued_requests=args.max_queued_requests,
        drain_timeout_s=args.drain_timeout_secs,
        access_log=args.access_log,
        **access_config_from_args(args),
    )


def run_gateway(args: argparse.Namespace) -> int:
    setup_logging(args.log_level, role="gateway")
    from tandem.gateway.torchless import block_torch

    block_torch()
    from tandem.gateway.server import serve

    try:
        config = config_from_args(args)
    except ValueError as exc:  # a bad flag: say which, no stack trace
        raise SystemExit(f"tandem gateway: error: {exc}") from None
    if use_uvloop(args.event_loop):
        import uvloop

        uvloop.run(serve(config, args.log_level))
    else:
        asyncio.run(serve(config, args.log_level))
    return 0


def use_uvloop(choice: str) -> bool:
    """``auto``: uvloop when it is installed (it is a dependency on Linux and macOS)."""
    if choice == "asyncio":
        return False
    try:
        import uvloop  # noqa: F401
    except ImportError:
        if choice == "uvloop":
            raise SystemExit("--event-loop uvloop: uvloop is not installed") from None
        return False
    return True
