"""The gateway's configuration: one validated dataclass built from the command line."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tandem.gateway.auth import ControlPlaneKey, ServingKey, check_distinct
from tandem.gateway.history.settings import check_history_settings
from tandem.gateway.history.store import HistoryLimits
from tandem.gateway.types import (
    BACKEND_CHOICES,
    ENCODE_POLICIES,
    MM_PROCESSING_MODES,
    PD_DISPATCH_MODES,
    TENSOR_TRANSPORT_MODES,
    WORKER_STREAM_CLIENTS,
    BackendChoice,
    EncodePolicy,
    HistoryBackend,
    MmProcessingMode,
    PdDispatch,
    TensorTransportMode,
    WorkerStreamClient,
)
from tandem.media import MediaPolicy

# Decoded images and pixel tensors of all in-flight requests (docs/operations.md, "Memory
# bounds for images"): room for one image at the default --mm-max-image-pixels (8192x8192
# RGB is 256 MiB in Pillow) with another request's pixel tensors beside it.
MM_MAX_INFLIGHT_BYTES = 512 << 20

# Preprocessed pixels kept per image (gateway/multimodal/pixel_cache.py): a 1024x1024 image
# is about 3 MiB of raw uint8 pixels for the built-in families, so this keeps the images of
# some 80 recent turns (multi-turn chats re-send them) at half the in-flight budget's size.
MM_PIXEL_CACHE_MB = 256
# Token ids of prompt pieces kept between requests (about 40 bytes a token with its text:
# ~10 MiB); gateway/prompt_tokens.py.
DEFAULT_PROMPT_CACHE_TOKENS = 262_144

# Niceness added to image pool processes: the event loop's token relaying goes first on a
# shared CPU, images take the rest (docs/benchmarks.md: text ITL p99 under image load
# 2.98 ms at 0, 0.58 ms at 10; image throughput within noise).
MM_WORKERS_NICE = 10


def default_mm_workers() -> int:
    """Image pool processes (gateway/multimodal/pool.py): the CPUs this gateway may use
    less one left to the event loop, at least 1 and at most 4 (past 4 the loop's own work
    on the pixels limits image throughput, and each process holds ~100 MiB of imports)."""
    import os

    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(4, cpus - 1))


# Protocols whose legs take router-side tensors, inline (no media refs, no shared memory).
INLINE_TENSOR_BACKENDS = frozenset({"sglang", "tokenspeed"})
# Protocols whose legs carry no pixel tensors: TensorRT-LLM takes each image's source bytes
# (its engine processes them), MLX takes no media at all.
NO_TENSOR_BACKENDS = frozenset({"trtllm", "mlx"})
# Protocols with no PD pairing on the wire (docs/worker-protocols.md): TensorRT-LLM's
# answers return no context-phase parameters to relay, MLX has no PD.
NO_PD_BACKENDS = frozenset({"trtllm", "mlx"})


@dataclass(slots=True)
class GatewayConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    worker_urls: list[str] = field(default_factory=list)
    pd_disaggregation: bool = False
    prefill_urls: list[str] = field(default_factory=list)
    # The bootstrap port given after a --prefill URL (SGLang's PD rendezvous; None: "none"
    # or not given, so the worker's own or SGLang's default), by canonical URL.
    prefill_bootstrap_ports: dict[str, int | None] = field(default_factory=dict)
    decode_urls: list[str] = field(default_factory=list)
    # E/P/D (TokenSpeed): images encoded on --encode workers, whose embeddings the prefill
    # worker pulls (gateway/backends/tokenspeed/epd.py); implies PD.
    epd_disaggregation: bool = False
    encode_urls: list[str] = field(default_factory=list)
    # The bootstrap port given after an --encode URL (where prefill workers meet it).
    encode_bootstrap_ports: dict[str, int | None] = field(default_factory=dict)
    encode_policy: EncodePolicy = "consistent_hashing"
    # The workers' protocol (docs/worker-protocols.md); "auto" is resolved at start-up by
    # asking the first configured worker (gateway/backend_detect.py).
    backend: BackendChoice = "auto"
    policy: str = "cache_aware"
    prefill_policy: str | None = None
    decode_policy: str | None = None
    model_path: Path | None = None
    served_model_name: str | None = None
    mm_processing: MmProcessingMode = "auto"
    mm_per_request_image_limit: int = 8
    mm_per_request_video_limit: int = 2
    # Decode + preprocess in this many processes (0: a thread of the gateway process) and
    # the per-image pixel cache's size (0: off); docs/operations.md, "Memory bounds".
    mm_workers: int = field(default_factory=default_mm_workers)
    mm_workers_nice: int = MM_WORKERS_NICE
    mm_pixel_cache_mb: int = MM_PIXEL_CACHE_MB
    # Token ids of prompt pieces kept between requests (0: off; gateway/prompt_tokens.py).
    prompt_cache_tokens: int = DEFAULT_PROMPT_CACHE_TOKENS
    media: MediaPolicy = field(default_factory=MediaPolicy)
    max_payload_size: int = 64 << 20
    request_timeout_s: float = 300.0
    max_retries: int = 2
    health_interval_s: float = 5.0
    health_timeout_s: float = 2.0
    health_failure_threshold: int = 2
    # The per-worker circuit breaker (gateway/workers/breaker.py), smg's flag names.
    cb_failure_threshold: int = 5
    cb_timeout_s: float = 10.0
    pd_dispatch: PdDispatch = "sequential"
    wire_dtype: str = "float32"
    # Admission control (gateway/admission.py); 0 turns a bound off.
    mm_max_inflight_bytes: int = MM_MAX_INFLIGHT_BYTES
    # Same-host shared-memory tensors (docs/operations.md, "Shared-memory tensor transport").
    # inline by default, as smg: shm needs the worker on this host as the same user, and a
    # container's small /dev/shm; auto is safe across hosts and the first thing to try.
    mm_tensor_transport: TensorTransportMode = "inline"
    mm_shm_min_bytes: int = 64 << 10
    # The client of the workers' Generate streams: h2, Tandem's own HTTP/2 client on the
    # event loop (tandem/wire/h2grpc: a sixth of grpc.aio's CPU per call), or grpcio.
    worker_stream_client: WorkerStreamClient = "h2"
    max_concurrent_requests: int = 256
    max_queued_requests: int = 512
    drain_timeout_s: float = 30.0
    access_log: bool = True  # one INFO line per generation request (access_log.py)
    # Output parsers (gateway/tools, gateway/reasoning.py); None: by the chat template.
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    # Access control (gateway/auth.py, docs/operations.md "Access control"); keys stay
    # out of the repr so that a logged config never shows one.
    api_key: str | None = field(default=None, repr=False)
    tenant_api_keys: list[ServingKey] = field(default_factory=list, repr=False)
    control_plane_api_keys: list[ControlPlaneKey] = field(default_factory=list, repr=False)
    # Stored Responses API conversations (gateway/history, docs/operations.md "Stored
    # responses (history backends)"). No sqlite path: $TANDEM_HISTORY_DIR or
    # ~/.cache/tandem/history, read when the store opens. The URL may hold a password.
    history_backend: HistoryBackend = "sqlite"
    history_sqlite_path: Path | None = None
    postgres_db_url: str | None = field(default=None, repr=False)
    history: HistoryLimits = field(default_factory=HistoryLimits)
    # Gateway processes serving one port (gateway/multiprocess); 1: this process alone.
    processes: int = 1

    def __post_init__(self) -> None:
        if self.mm_processing not in MM_PROCESSING_MODES:
            raise ValueError(f"--mm-processing must be one of {', '.join(MM_PROCESSING_MODES)}")
        if self.backend not in BACKEND_CHOICES:
            raise ValueError(f"--backend must be one of {', '.join(BACKEND_CHOICES)}")
        self._check_backend_flags()
        self._check_epd()
        if self.pd_dispatch not in PD_DISPATCH_MODES:
            raise ValueError(f"--pd-dispatch must be one of {', '.join(PD_DISPATCH_MODES)}")
        if self.pd_disaggregation and not (self.prefill_urls and self.decode_urls):
            raise ValueError("--pd-disaggregation needs at least one --prefill and one --decode")
        if not self.pd_disaggregation and (self.prefill_urls or self.decode_urls):
            raise ValueError("--prefill/--decode need --pd-disaggregation")
        if self.max_payload_size < 1024:
            raise ValueError("--max-payload-size must be at least 1024 bytes")
        if self.request_timeout_s <= 0:
            raise ValueError("--request-timeout-secs must be positive")
        if self.mm_per_request_image_limit < 0:
            raise ValueError("--mm-per-request-image-limit must be >= 0")
        if self.mm_per_request_video_limit < 0:
            raise ValueError("--mm-per-request-video-limit must be >= 0")
        if self.mm_workers < 0:
            raise ValueError("--mm-workers must be >= 0")
        if not 0 <= self.mm_workers_nice <= 19:
            raise ValueError("--mm-workers-nice must be between 0 and 19")
        if self.mm_pixel_cache_mb < 0:
            raise ValueError("--mm-pixel-cache-mb must be >= 0")
        if self.prompt_cache_tokens < 0:
            raise ValueError("--prompt-cache-tokens must be >= 0")
        if self.health_interval_s <= 0 or self.health_timeout_s <= 0:
            raise ValueError("--health-check-interval-secs and -timeout-secs must be positive")
        if self.health_failure_threshold < 1:
            raise ValueError("--health-failure-threshold must be >= 1")
        if self.cb_failure_threshold < 1 or self.cb_timeout_s < 0:
            raise ValueError(
                "--cb-failure-threshold must be >= 1 and --cb-timeout-duration-secs >= 0"
            )
        if self.max_retries < 0:
            raise ValueError("--max-retries must be >= 0")
        if self.mm_max_inflight_bytes < 0:
            raise ValueError("--multimodal-max-inflight-bytes must be >= 0")
        if self.mm_tensor_transport not in TENSOR_TRANSPORT_MODES:
            modes = ", ".join(TENSOR_TRANSPORT_MODES)
            raise ValueError(f"--multimodal-tensor-transport must be one of {modes}")
        if self.worker_stream_client not in WORKER_STREAM_CLIENTS:
            choices = ", ".join(WORKER_STREAM_CLIENTS)
            raise ValueError(f"--worker-stream-client must be one of {choices}")
        if self.mm_shm_min_bytes < 1:
            raise ValueError("--multimodal-shm-min-bytes must be at least 1")
        if self.max_concurrent_requests < 0 or self.max_queued_requests < 0:
            raise ValueError("--max-concurrent-requests and --max-queued-requests must be >= 0")
        if self.drain_timeout_s < 0:
            raise ValueError("--drain-timeout-secs must be >= 0")
        _check_parsers(self.tool_call_parser, self.reasoning_parser)
        check_processes(self.processes, self.history_backend)
        check_history_settings(
            self.history_backend, self.history_sqlite_path, self.postgres_db_url, self.history
        )
        if self.api_key is not None and not self.api_key:
            raise ValueError("--api-key must not be empty")
        check_distinct(self.serving_keys, "--api-key/--tenant-api-key")
        check_distinct(self.control_plane_api_keys, "--control-plane-api-keys")

    def _check_backend_flags(self) -> None:
        """Flags a protocol cannot honour, refused at start-up by name."""
        backend = self.backend
        if backend in INLINE_TENSOR_BACKENDS and self.mm_processing == "worker":
            raise ValueError(
                f"--mm-processing worker: {backend} workers take preprocessed pixels, "
                "not media URLs; use --mm-processing auto or router"
            )
        if backend in NO_TENSOR_BACKENDS and self.mm_processing == "worker":
            raise ValueError(
                f"--mm-processing worker: the {backend} worker protocol carries no media "
                "URLs; use --mm-processing auto or router"
            )
        if backend in INLINE_TENSOR_BACKENDS and self.mm_tensor_transport == "shm":
            raise ValueError(
                f"--multimodal-tensor-transport shm: {backend}'s tensors travel inline "
                "only here; use inline or auto"
            )
        if backend in NO_TENSOR_BACKENDS and self.mm_tensor_transport == "shm":
            raise ValueError(
                f"--multimodal-tensor-transport shm: the {backend} worker protocol carries "
                "no pixel tensors; use inline or auto"
            )
        if backend in NO_PD_BACKENDS and (self.pd_disaggregation or self.epd_disaggregation):
            raise ValueError(
                f"--pd-disaggregation: the {backend} worker protocol has no PD pairing "
                "(runtime_pd_not_supported; docs/worker-protocols.md); serve it aggregated "
                "with --worker-urls"
            )

    def _check_epd(self) -> None:
        if self.encode_policy not in ENCODE_POLICIES:
            raise ValueError(f"--encode-policy must be one of {', '.join(ENCODE_POLICIES)}")
        if self.encode_urls and not self.epd_disaggregation:
            raise ValueError("--encode needs --epd-disaggregation")
        if not self.epd_disaggregation:
            return
        if not self.encode_urls:
            raise ValueError("--epd-disaggregation needs at least one --encode worker")
        if self.backend not in ("auto", "tokenspeed"):
            raise ValueError(
                f"--epd-disaggregation: encoder disaggregation runs over the tokenspeed "
                f"worker protocol, not {self.backend} (docs/worker-protocols.md)"
            )
        self.pd_disaggregation = True  # E/P/D is PD with an encode stage before it

    @property
    def serving_keys(self) -> list[ServingKey]:
        """Every key that opens /v1/*: ``--api-key`` (no tenant) and the tenant keys."""
        plain = [ServingKey(self.api_key)] if self.api_key else []
        return [*plain, *self.tenant_api_keys]


def _check_parsers(tool_call_parser: str | None, reasoning_parser: str | None) -> None:
    from tandem.gateway.reasoning import REASONING_PARSERS
    from tandem.gateway.tools import TOOL_PARSERS

    if tool_call_parser is not None and tool_call_parser not in TOOL_PARSERS:
        raise ValueError(f"--tool-call-parser must be one of {', '.join(sorted(TOOL_PARSERS))}")
    if reasoning_parser is not None and reasoning_parser not in REASONING_PARSERS:
        names = ", ".join(sorted(REASONING_PARSERS))
        raise ValueError(f"--reasoning-parser must be one of {names}")


def check_processes(processes: int, history_backend: str) -> None:
    """``--processes`` against the history backend (``tandem serve`` checks it up front too)."""
    if processes < 1:
        raise ValueError("--processes must be >= 1")
    if processes > 1 and history_backend == "memory":
        raise ValueError(
            "--processes > 1: --history-backend memory keeps stored responses inside one "
            "gateway process, so the others would not find them; use --history-backend "
            "sqlite or postgres"
        )
