"""Every Prometheus metric of the gateway, defined once, with the `tandem_` prefix.

Under ``--processes N`` every process keeps its values in prometheus_client's multiprocess
files and one ``/metrics`` sums them (gateway/multiprocess/metrics_dir.py); each gauge's
``multiprocess_mode`` says how: counts of this gateway's work add up over live processes
(``livesum``), a worker is healthy only if every process sees it so (``livemin``), and its
breaker is open if any process opened it (``livemax``). With one process the modes are unused.

Label cardinality is bounded: routes, status codes, error codes and worker URLs
are finite sets; request ids and model outputs never become labels.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

REGISTRY = CollectorRegistry(auto_describe=True)
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)

REQUESTS = Counter(
    "tandem_requests_total",
    "HTTP requests by route, status and error code ('' on success)",
    ["route", "status", "code"],
    registry=REGISTRY,
)
REQUEST_SECONDS = Histogram(
    "tandem_request_duration_seconds",
    "Time from request arrival to the last byte of the response",
    ["route"],
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)
TTFT_SECONDS = Histogram(
    "tandem_time_to_first_token_seconds",
    "Time from request arrival to the first generated token",
    ["route"],
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)
WORKER_IN_FLIGHT = Gauge(
    "tandem_worker_in_flight",
    "Requests in flight per worker",
    ["worker"],
    multiprocess_mode="livesum",
    registry=REGISTRY,
)
WORKER_HEALTHY = Gauge(
    "tandem_worker_healthy",
    "1 when the worker passed its last health check",
    ["worker"],
    multiprocess_mode="livemin",
    registry=REGISTRY,
)
CIRCUIT_OPEN = Gauge(
    "tandem_worker_circuit_open",
    "1 while the worker's circuit breaker is open",
    ["worker"],
    multiprocess_mode="livemax",
    registry=REGISTRY,
)
# Routing from the workers' KV events (gateway/kv_events): one series per worker.
KV_EVENTS_APPLIED = Counter(
    "tandem_kv_events_applied_total",
    "KV cache events applied to the gateway's event index, per worker",
    ["worker"],
    registry=REGISTRY,
)
KV_EVENT_BLOCKS = Gauge(
    "tandem_kv_event_blocks",
    "Blocks the event index holds for the worker",
    ["worker"],
    # Every gateway process follows the same stream: one figure, not their sum.
    multiprocess_mode="livemax",
    registry=REGISTRY,
)
KV_EVENT_RESYNCS = Counter(
    "tandem_kv_event_resyncs_total",
    "Times the worker's index was dropped for a resync (sequence gap or lost stream)",
    ["worker"],
    registry=REGISTRY,
)
KV_EVENT_DROPPED_BLOCKS = Counter(
    "tandem_kv_event_dropped_blocks_total",
    "Stored blocks the index could not key (their parent was unknown)",
    ["worker"],
    registry=REGISTRY,
)
KV_EVENT_SERIES = (KV_EVENTS_APPLIED, KV_EVENT_BLOCKS, KV_EVENT_RESYNCS, KV_EVENT_DROPPED_BLOCKS)
RETRIES = Counter(
    "tandem_retries_total", "Requests retried on another worker", ["route"], registry=REGISTRY
)
PROMPT_TOKENS = Counter(
    "tandem_prompt_tokens_total",
    "Prompt tokens by where their ids came from: the prompt token cache or the tokenizer",
    ["source"],
    registry=REGISTRY,
)
MM_ITEMS = Counter(
    "tandem_mm_items_total", "Media items by processing path", ["path"], registry=REGISTRY
)
MM_TENSOR_BYTES = Counter(
    "tandem_mm_tensor_bytes_total",
    "Tensor payload bytes sent to workers, by leg (aggregated, prefill, decode) and kind",
    ["leg", "kind"],
    registry=REGISTRY,
)
MM_TENSORS = Counter(
    "tandem_mm_tensors_total",
    "Tensors of multimodal legs sent to workers, by path (inline or shm)",
    ["path"],
    registry=REGISTRY,
)
MM_SHM_BYTES = Counter(
    "tandem_mm_shm_bytes_total",
    "Tensor bytes handed to workers through shared-memory segments",
    registry=REGISTRY,
)
MM_SHM_WRITE_FAILURES = Counter(
    "tandem_mm_shm_write_failures_total",
    "Shared-memory tensor writes that failed and fell back to inline",
    registry=REGISTRY,
)
MM_PROCESSING = Counter(
    "tandem_mm_processing_total",
    "Router/worker media path decisions",
    ["mode", "reason"],
    registry=REGISTRY,
)
MEDIA_FETCH_SECONDS = Histogram(
    "tandem_media_fetch_seconds",
    "Fetching and decoding a request's media",
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)
MEDIA_PREPROCESS_SECONDS = Histogram(
    "tandem_media_preprocess_seconds",
    "Preprocessing a request's images",
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)

# --- prefill/decode ---------------------------------------------------------------------
PD_PREFILL_SECONDS = Histogram(
    "tandem_pd_prefill_duration_seconds",
    "Prefill leg: sent → drained (sequential dispatch)",
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)
PD_KV_TRANSFER_SECONDS = Histogram(
    "tandem_pd_kv_transfer_duration_seconds",
    "Prefill drained → decode leg's first frame (the KV pull happens in between)",
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)
PD_TTFT_SECONDS = Histogram(
    "tandem_pd_ttft_seconds",
    "Prefill sent → first decode frame",
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)
PD_KV_MODE = Counter(
    "tandem_pd_kv_connector_mode_total",
    "PD requests by KV handoff mode (mooncake, nixl, tandem, passthrough)",
    ["mode"],
    registry=REGISTRY,
)
PD_KV_TRANSFER_FAILURES = Counter(
    "tandem_pd_kv_transfer_failures_total",
    "Prefill legs that were asked for KV params and returned none",
    registry=REGISTRY,
)
WORKER_ERRORS = Counter(
    "tandem_worker_errors_total",
    "Legs that failed to start or failed mid-stream",
    ["worker_type"],
    registry=REGISTRY,
)

# --- admission control ------------------------------------------------------------------
ADMISSION_REJECTED = Counter(
    "tandem_admission_rejected_total",
    "Requests refused by admission control, by reason "
    "(queue_full, queue_timeout, mm_inflight_bytes, mm_too_large, shutting_down)",
    ["reason"],
    registry=REGISTRY,
)
REQUESTS_RUNNING = Gauge(
    "tandem_requests_running",
    "Generation requests holding an admission slot",
    multiprocess_mode="livesum",
    registry=REGISTRY,
)
REQUESTS_QUEUED = Gauge(
    "tandem_requests_queued",
    "Generation requests waiting for an admission slot",
    multiprocess_mode="livesum",
    registry=REGISTRY,
)
MM_INFLIGHT_BYTES = Gauge(
    "tandem_mm_inflight_bytes",
    "Image bytes held by in-flight requests, decoded or as pixel tensors "
    "(against --multimodal-max-inflight-bytes)",
    multiprocess_mode="livesum",
    registry=REGISTRY,
)
MM_PIXEL_CACHE_HITS = Counter(
    "tandem_mm_pixel_cache_hits_total",
    "Images whose preprocessed pixels came from --mm-pixel-cache-mb",
    registry=REGISTRY,
)
MM_PIXEL_CACHE_MISSES = Counter(
    "tandem_mm_pixel_cache_misses_total",
    "Images looked up in the pixel cache and decoded + preprocessed",
    registry=REGISTRY,
)
MM_PIXEL_CACHE_BYTES = Gauge(
    "tandem_mm_pixel_cache_bytes",
    "Bytes of preprocessed pixels held by the pixel cache (against --mm-pixel-cache-mb)",
    multiprocess_mode="livesum",
    registry=REGISTRY,
)
MM_POOL_RESTARTS = Counter(
    "tandem_mm_pool_restarts_total",
    "Image pool processes replaced after one died (--mm-workers)",
    registry=REGISTRY,
)


_CHILDREN: dict[tuple[object, tuple[str, ...]], Any] = {}


def child(metric: Counter | Gauge | Histogram, *values: str) -> Any:
    """``metric.labels(*values)``, remembered: the same child prometheus_client would give
    (it never drops one here), without its validation and lock on every request. Label
    values are bounded sets (see above), so this is too."""
    key = (metric, values)
    found = _CHILDREN.get(key)
    if found is None:
        found = _CHILDREN[key] = metric.labels(*values)
    return found
