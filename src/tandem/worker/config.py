"""The worker's configuration: one validated dataclass built from the command line."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

from tandem.hostport import check_host, is_wildcard
from tandem.media import MediaPolicy
from tandem.worker.media_limits import MediaRefsLimitConfig

# --role: the legs this worker serves. The gateway names its own pool roles apart
# (gateway/workers/worker.py: an aggregated pool's workers are "regular" there). "encode":
# a TokenSpeed E/P/D encode worker (images in, embeddings out; no Generate).
Role = Literal["prefill", "decode", "both", "encode"]
# kv_connector values the worker may advertise. "TandemConnector" is Tandem's own
# side channel under its own name; "NixlConnector" advertises the same protocol under
# the name gateways that relay vLLM's NIXL params (smg) recognise.
KvConnector = Literal["TandemConnector", "NixlConnector"]
# "embedded": the PyTorch engine; "null": canned tokens at once, no weights (benchmarks).
EngineKind = Literal["embedded", "null"]
# --json-whitespace: what JSON grammars allow between tokens (engine/structured.py).
JsonWhitespace = Literal["compact", "any"]
# --protocol: the worker protocol served (worker/adapters.py): vLLM's
# vllm.grpc.engine.VllmEngine, SGLang's sglang.grpc.scheduler.SglangScheduler or
# TokenSpeed's tokenspeed.grpc.scheduler.TokenSpeedScheduler, TensorRT-LLM's
# trtllm.TrtllmService or MLX's mlx.grpc.engine.MlxEngine.
WorkerProtocol = Literal["vllm", "sglang", "tokenspeed", "trtllm", "mlx"]
# The protocols whose PD legs meet at a bootstrap room (--disaggregation-bootstrap-port).
BOOTSTRAP_PROTOCOLS: tuple[WorkerProtocol, ...] = ("sglang", "tokenspeed")
# The protocols with no PD legs at all: such a worker serves whole requests (--role both).
AGGREGATED_ONLY_PROTOCOLS: tuple[WorkerProtocol, ...] = ("trtllm", "mlx")

ROLES: tuple[Role, ...] = get_args(Role)
KV_CONNECTORS: tuple[KvConnector, ...] = get_args(KvConnector)
ENGINES: tuple[EngineKind, ...] = get_args(EngineKind)
JSON_WHITESPACE: tuple[JsonWhitespace, ...] = get_args(JsonWhitespace)
PROTOCOLS: tuple[WorkerProtocol, ...] = get_args(WorkerProtocol)


@dataclass(slots=True)
class WorkerConfig:
    model: str = "tiny-qwen3-vl"
    protocol: WorkerProtocol = "vllm"
    host: str = "127.0.0.1"
    port: int = 0
    # SGLang, TokenSpeed: where PD partners meet (--disaggregation-bootstrap-port, their flag):
    # a second port of the same server with the KV side channel; None: the gRPC port.
    bootstrap_port: int | None = None
    # The host decode workers and gateways dial (KV params, READY line); None: ``host``.
    advertise_host: str | None = None
    role: Role = "both"
    language_model_only: bool = False
    mm_processor: bool = True  # accept media_refs and process media on this worker
    media: MediaPolicy = field(default_factory=MediaPolicy)
    # --mm-max-inflight, --mm-max-items, --mm-max-decoded-bytes (worker/media_limits.py)
    media_limits: MediaRefsLimitConfig = field(default_factory=MediaRefsLimitConfig)
    kv_lease_s: float = 30.0
    kv_connector: KvConnector = "TandemConnector"
    prefix_cache_bytes: int = 64 << 20
    block_size: int = 16
    # How long a decode leg waits for its prefill's KV to appear (a gateway-minted transfer
    # id, an SGLang bootstrap room) before it fails UNAVAILABLE.
    kv_pull_wait_s: float = 10.0
    # KV events over SubscribeKvEvents (worker/kv_events): on unless --no-kv-events; load
    # records go out every kv_events_heartbeat_s while nothing else does.
    kv_events: bool = True
    kv_events_heartbeat_s: float = 1.0
    # --role encode: the LRU of image features by the pixels' digest (0: off);
    # worker/embedding_cache.py.
    embedding_cache_mb: int = 256
    threads: int = 1
    served_model_name: str | None = None
    engine: EngineKind = "embedded"
    null_token_delay_s: float = 0.0  # the null engine's pause before each token
    # JSON grammars: "compact" (no free whitespace, so a model cannot pad forever) or "any"
    # (vLLM's default: any whitespace between tokens); engine/structured.py.
    json_whitespace: JsonWhitespace = "compact"
    # Test-only: leave out the Tandem marker on GetServerInfo, so gateways treat this worker
    # like a vLLM worker (sent data: URLs instead of media URLs; tandem.wire.worker_marker).
    test_only_advertise_as_vllm: bool = False

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"--engine must be one of {', '.join(ENGINES)}, got {self.engine!r}")
        if self.null_token_delay_s < 0:
            raise ValueError("--null-token-delay-ms must be >= 0")
        if self.role not in ROLES:
            raise ValueError(f"--role must be one of {', '.join(ROLES)}, got {self.role!r}")
        if self.json_whitespace not in JSON_WHITESPACE:
            raise ValueError(f"--json-whitespace must be one of {', '.join(JSON_WHITESPACE)}")
        if self.kv_connector not in KV_CONNECTORS:
            raise ValueError(f"--kv-connector must be one of {', '.join(KV_CONNECTORS)}")
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"--protocol must be one of {', '.join(PROTOCOLS)}")
        self._check_encode_role()
        if self.protocol in AGGREGATED_ONLY_PROTOCOLS and self.role != "both":
            raise ValueError(
                f"--role {self.role}: the {self.protocol} worker protocol has no PD legs; "
                "serve it with --role both"
            )
        self._check_hosts()
        if not 0 <= self.port < 65536:
            raise ValueError(f"--port must be in 0..65535, got {self.port}")
        self._check_bootstrap_port()
        if self.kv_lease_s <= 0:
            raise ValueError("--kv-lease-secs must be positive")
        if not self.kv_events_heartbeat_s > 0:
            raise ValueError("--kv-events-heartbeat-secs must be > 0")
        if not self.kv_pull_wait_s >= 0:
            raise ValueError("--kv-pull-wait-secs must be >= 0")
        if self.embedding_cache_mb < 0:
            raise ValueError("--embedding-cache-mb must be >= 0")
        if self.prefix_cache_bytes < 0:
            raise ValueError("--prefix-cache-bytes must be >= 0")
        if self.threads < 1:
            raise ValueError("--threads must be >= 1")

    def _check_bootstrap_port(self) -> None:
        port = self.bootstrap_port
        if port is None:
            return
        if self.protocol not in BOOTSTRAP_PROTOCOLS:
            raise ValueError(
                "--disaggregation-bootstrap-port is SGLang's and TokenSpeed's rendezvous port: "
                "it needs --protocol sglang or --protocol tokenspeed"
            )
        if not 0 < port < 65536:
            raise ValueError(f"--disaggregation-bootstrap-port must be in 1..65535, got {port}")
        if port == self.port:
            raise ValueError(
                f"--disaggregation-bootstrap-port {port} is the --port already; leave it out "
                "to use the gRPC port as the bootstrap port"
            )

    def _check_encode_role(self) -> None:
        """An encode worker is TokenSpeed's E/P/D role, and it runs the vision encoder."""
        if self.role != "encode":
            return
        if self.protocol != "tokenspeed":
            raise ValueError(
                "--role encode is TokenSpeed's E/P/D encode worker: it needs --protocol "
                f"tokenspeed (got --protocol {self.protocol})"
            )
        if self.engine != "embedded":
            raise ValueError(
                "--role encode runs the vision encoder: it needs --engine embedded "
                f"(got --engine {self.engine})"
            )
        if self.language_model_only:
            raise ValueError(
                "--role encode runs the vision encoder: leave out --language-model-only"
            )

    def _check_hosts(self) -> None:
        self.host = check_host(self.host, "--host")
        if self.advertise_host is not None:
            self.advertise_host = check_host(self.advertise_host, "--advertise-host")
            if is_wildcard(self.advertise_host):
                raise ValueError(
                    f"--advertise-host {self.advertise_host!r} is a wildcard: give the name "
                    "or address other hosts reach this worker at"
                )
        elif is_wildcard(self.host):
            # A wildcard names no interface: a decode worker handed it as the KV address
            # would dial itself (docs/operations.md, "Addresses").
            raise ValueError(
                f"--host {self.host or repr('')} listens on every interface but is no "
                "address to dial: add --advertise-host HOST, the name or address that "
                "decode workers and the gateway reach this worker at"
            )

    @property
    def dial_host(self) -> str:
        """The host this worker tells others to dial: its KV address and READY line."""
        return self.advertise_host or self.host

    @property
    def accepts_media_refs(self) -> bool:
        # A worker without a vision encoder must never advertise a media processor.
        return self.mm_processor and not self.language_model_only

    @property
    def model_name(self) -> str:
        return self.served_model_name or Path(self.model).name
