"""`tandem gateway` flags → GatewayConfig. Names follow smg's where the feature is the same."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from tandem.gateway.auth_flags import access_config_from_args, add_access_flags
from tandem.gateway.config import GatewayConfig
from tandem.gateway.history.flags import add_history_flags, history_config_from_args
from tandem.gateway.types import (
    BACKEND_CHOICES,
    ENCODE_POLICIES,
    EVENT_LOOPS,
    MM_PROCESSING_MODES,
    PD_DISPATCH_MODES,
    TENSOR_TRANSPORT_MODES,
    WORKER_STREAM_CLIENTS,
    EventLoop,
)
from tandem.hostport import bare_host, canonical_address
from tandem.log import DEFAULT_LOG_LEVEL, setup_logging
from tandem.media.flags import add_media_flags, media_policy_from_args

# Every flag's default is the config's own (tests/unit/test_cli_defaults.py checks it).
_DEFAULTS = GatewayConfig()
# How often a thread holding the GIL hands it over, in the gateway (Python's default: 5 ms).
GIL_SWITCH_INTERVAL_S = 0.001


def _urls(values: list[str] | None) -> list[str]:
    # One spelling per worker (IPv6 in brackets); a malformed address fails here, by name.
    return [canonical_address(u, "grpc") for group in values or [] for u in group]


def _urls_with_ports(
    values: list[list[str]] | None, flag: str
) -> tuple[list[str], dict[str, int | None]]:
    """``--prefill URL [BOOTSTRAP_PORT] [URL [BOOTSTRAP_PORT]] …`` (and ``--encode``) as smg
    reads them: a word that is a port number or ``none`` belongs to the URL before it (the
    PD or E/P/D rendezvous)."""
    urls: list[str] = []
    ports: dict[str, int | None] = {}
    for group in values or []:
        for word in group:
            port_word = word.strip().lower()
            if port_word == "none" or (port_word.isascii() and port_word.isdigit()):
                if not urls or urls[-1] in ports:
                    raise ValueError(f"{flag}: bootstrap port {word!r} follows no URL")
                port = None if port_word == "none" else int(port_word)
                if port is not None and not 0 < port < 65536:
                    raise ValueError(f"{flag}: bootstrap port {word!r} is not in 1..65535")
                ports[urls[-1]] = port
                continue
            urls.append(canonical_address(word, "grpc"))
    return urls, ports


def add_gateway_parser(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("gateway", help="the OpenAI-compatible gateway")
    p.add_argument("--host", default=_DEFAULTS.host)
    p.add_argument("--port", type=int, default=_DEFAULTS.port)
    p.add_argument("--worker-urls", nargs="+", action="append", help="aggregated workers")
    p.add_argument("--pd-disaggregation", action="store_true")
    p.add_argument(
        "--backend",
        choices=BACKEND_CHOICES,
        default=_DEFAULTS.backend,
        help="the workers' gRPC protocol; auto asks the first configured worker "
        "(SGLang's service first, then vLLM's, then TokenSpeed's)",
    )
    p.add_argument(
        "--prefill",
        nargs="+",
        action="append",
        metavar="URL [BOOTSTRAP_PORT]",
        help="prefill worker URLs, each optionally followed by its bootstrap port (the "
        "SGLang and TokenSpeed PD rendezvous; a number or 'none')",
    )
    p.add_argument("--decode", nargs="+", action="append", help="decode worker URLs")
    p.add_argument(
        "--epd-disaggregation",
        action="store_true",
        help="encoder disaggregation (tokenspeed): images encoded on --encode workers, their "
        "embeddings pulled by the prefill workers; needs --prefill and --decode",
    )
    p.add_argument(
        "--encode",
        nargs="+",
        action="append",
        metavar="URL [BOOTSTRAP_PORT]",
        help="encode worker URLs, each optionally followed by its bootstrap port (where "
        "prefill workers fetch the embeddings; a number or 'none')",
    )
    p.add_argument(
        "--encode-policy",
        choices=ENCODE_POLICIES,
        default=_DEFAULTS.encode_policy,
        help="the encode worker of an image: by its content hash (a repeated image finds "
        "its cached embedding), in turn, or at random",
    )
    p.add_argument("--policy", default=_DEFAULTS.policy)
    p.add_argument("--prefill-policy", default=_DEFAULTS.prefill_policy)
    p.add_argument("--decode-policy", default=_DEFAULTS.decode_policy)
    p.add_argument("--pd-dispatch", choices=PD_DISPATCH_MODES, default=_DEFAULTS.pd_dispatch)
    p.add_argument("--model-path", type=Path, default=_DEFAULTS.model_path)
    p.add_argument("--served-model-name", default=_DEFAULTS.served_model_name)
    p.add_argument("--mm-processing", choices=MM_PROCESSING_MODES, default=_DEFAULTS.mm_processing)
    p.add_argument(
        "--mm-per-request-image-limit", type=int, default=_DEFAULTS.mm_per_request_image_limit
    )
    p.add_argument(
        "--mm-per-request-video-limit", type=int, default=_DEFAULTS.mm_per_request_video_limit
    )
    p.add_argument(
        "--mm-workers",
        type=int,
        default=_DEFAULTS.mm_workers,
        help="processes that decode and preprocess images (0: a thread of the gateway; "
        "default: the usable CPUs less one, 1 to 4)",
    )
    p.add_argument(
        "--mm-workers-nice",
        type=int,
        default=_DEFAULTS.mm_workers_nice,
        help="niceness added to the image pool processes, 0 to 19 (default 10): token "
        "relaying on the event loop goes first where they share CPUs",
    )
    p.add_argument(
        "--mm-pixel-cache-mb",
        type=int,
        default=_DEFAULTS.mm_pixel_cache_mb,
        help="MiB of preprocessed pixels kept per image, LRU (0: off)",
    )
    p.add_argument(
        "--prompt-cache-tokens",
        type=int,
        default=_DEFAULTS.prompt_cache_tokens,
        help="token ids of prompt pieces (the text between special tokens) kept to skip "
        "tokenizing them again, LRU (0: off)",
    )
    add_media_flags(p)
    p.add_argument("--max-payload-size", type=int, default=_DEFAULTS.max_payload_size)
    p.add_argument("--request-timeout-secs", type=float, default=_DEFAULTS.request_timeout_s)
    p.add_argument("--max-retries", type=int, default=_DEFAULTS.max_retries)
    p.add_argument("--health-check-interval-secs", type=float, default=_DEFAULTS.health_interval_s)
    p.add_argument(
        "--health-check-timeout-secs",
        type=float,
        default=_DEFAULTS.health_timeout_s,
        help="deadline of one HealthCheck call",
    )
    p.add_argument(
        "--health-failure-threshold",
        type=int,
        default=_DEFAULTS.health_failure_threshold,
        help="failed health checks in a row before a worker leaves the pool",
    )
    p.add_argument(
        "--cb-failure-threshold",
        type=int,
        default=_DEFAULTS.cb_failure_threshold,
        help="failures in a row (requests or health checks) that open a worker's breaker",
    )
    p.add_argument(
        "--cb-timeout-duration-secs",
        type=float,
        default=_DEFAULTS.cb_timeout_s,
        help="how long an open breaker keeps requests away before one probe; for a worker "
        "that was down, its first good health check closes the breaker sooner",
    )
    p.add_argument(
        "--multimodal-max-inflight-bytes",
        type=int,
        default=_DEFAULTS.mm_max_inflight_bytes,
        help="image bytes (decoded, then pixel tensors) all in-flight requests may hold "
        "(0: no limit)",
    )
    p.add_argument(
        "--multimodal-tensor-transport",
        choices=TENSOR_TRANSPORT_MODES,
        default=_DEFAULTS.mm_tensor_transport,
        help="how pixel tensors reach a worker: inline in the message; shm: /dev/shm "
        "segments (the worker on this host); auto: shm for workers that share our /dev/shm",
    )
    p.add_argument(
        "--worker-stream-client",
        choices=WORKER_STREAM_CLIENTS,
        default=_DEFAULTS.worker_stream_client,
        help="the client of vLLM-protocol Generate streams: h2, Tandem's HTTP/2 client on the "
        "event loop (less CPU per call and per token); grpcio: grpc.aio",
    )
    p.add_argument(
        "--multimodal-shm-min-bytes",
        type=int,
        default=_DEFAULTS.mm_shm_min_bytes,
        help="smallest tensor sent through shared memory under shm/auto",
    )
    p.add_argument(
        "--max-concurrent-requests",
        type=int,
        default=_DEFAULTS.max_concurrent_requests,
        help="generation requests processed at once (0: no limit)",
    )
    p.add_argument(
        "--max-queued-requests",
        type=int,
        default=_DEFAULTS.max_queued_requests,
        help="requests waiting for a slot beyond --max-concurrent-requests; more get 429",
    )
    p.add_argument(
        "--drain-timeout-secs",
        type=float,
        default=_DEFAULTS.drain_timeout_s,
        help="on SIGTERM, how long in-flight requests may take to finish",
    )
    p.add_argument(
        "--event-loop",
        choices=EVENT_LOOPS,
        default="auto",  # no config field: the loop is chosen before the config is built
        help="auto: uvloop when installed (less gateway CPU per request than asyncio's loop)",
    )
    add_access_flags(p)
    add_history_flags(p)
    p.add_argument(
        "--tool-call-parser",
        default=_DEFAULTS.tool_call_parser,
        help="how tool calls are read from the output (default: from the chat template)",
    )
    p.add_argument(
        "--reasoning-parser",
        default=_DEFAULTS.reasoning_parser,
        help="split the model's thought into reasoning_content (default: none)",
    )
    p.add_argument(
        "--processes",
        type=int,
        default=_DEFAULTS.processes,
        help="gateway processes serving the one port (SO_REUSEPORT), each with its own event "
        "loop; limits, the image pool and /metrics are shared out (docs/operations.md)",
    )
    p.add_argument("--log-level", default=DEFAULT_LOG_LEVEL)
    p.add_argument(
        "--no-access-log",
        dest="access_log",
        action="store_false",
        help="no per-request log line (the request metrics stay)",
    )
    p.set_defaults(run=run_gateway)


def config_from_args(args: argparse.Namespace) -> GatewayConfig:
    media = media_policy_from_args(args)
    prefill_urls, bootstrap_ports = _urls_with_ports(args.prefill, "--prefill")
    encode_urls, encode_ports = _urls_with_ports(args.encode, "--encode")
    return GatewayConfig(
        host=bare_host(args.host),
        port=args.port,
        worker_urls=_urls(args.worker_urls),
        pd_disaggregation=args.pd_disaggregation,
        prefill_urls=prefill_urls,
        prefill_bootstrap_ports=bootstrap_ports,
        epd_disaggregation=args.epd_disaggregation,
        encode_urls=encode_urls,
        encode_bootstrap_ports=encode_ports,
        encode_policy=args.encode_policy,
        backend=args.backend,
        decode_urls=_urls(args.decode),
        policy=args.policy,
        prefill_policy=args.prefill_policy,
        decode_policy=args.decode_policy,
        pd_dispatch=args.pd_dispatch,
        model_path=args.model_path,
        served_model_name=args.served_model_name,
        mm_processing=args.mm_processing,
        mm_per_request_image_limit=args.mm_per_request_image_limit,
        mm_per_request_video_limit=args.mm_per_request_video_limit,
        mm_workers=args.mm_workers,
        mm_workers_nice=args.mm_workers_nice,
        mm_pixel_cache_mb=args.mm_pixel_cache_mb,
        prompt_cache_tokens=args.prompt_cache_tokens,
        media=media,
        max_payload_size=args.max_payload_size,
        request_timeout_s=args.request_timeout_secs,
        max_retries=args.max_retries,
        health_interval_s=args.health_check_interval_secs,
        health_timeout_s=args.health_check_timeout_secs,
        health_failure_threshold=args.health_failure_threshold,
        cb_failure_threshold=args.cb_failure_threshold,
        cb_timeout_s=args.cb_timeout_duration_secs,
        mm_max_inflight_bytes=args.multimodal_max_inflight_bytes,
        mm_tensor_transport=args.multimodal_tensor_transport,
        mm_shm_min_bytes=args.multimodal_shm_min_bytes,
        worker_stream_client=args.worker_stream_client,
        max_concurrent_requests=args.max_concurrent_requests,
        max_queued_requests=args.max_queued_requests,
        drain_timeout_s=args.drain_timeout_secs,
        access_log=args.access_log,
        tool_call_parser=args.tool_call_parser,
        reasoning_parser=args.reasoning_parser,
        processes=args.processes,
        **access_config_from_args(args),
        **history_config_from_args(args),
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
    if config.processes > 1:  # N children on one port (gateway/multiprocess)
        from tandem.gateway.multiprocess.supervisor import run_supervisor

        return run_supervisor(config, args.log_level, args.event_loop)
    # Threads hand the GIL over every millisecond instead of every five: while a pool thread
    # runs Python (rendering a long prompt, counting a large body), each of the event loop's
    # turns waited up to 5 ms for the GIL, and a stream's token took several turns
    # (docs/benchmarks.md, "Event-loop stalls under large inputs").
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    if use_uvloop(args.event_loop):
        import uvloop

        uvloop.run(serve(config, args.log_level))
    else:
        asyncio.run(serve(config, args.log_level))
    return 0


def use_uvloop(choice: EventLoop) -> bool:
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
