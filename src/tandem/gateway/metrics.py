"""Every Prometheus metric of the gateway, defined once, with the `tandem_` prefix.

Label cardinality is bounded: routes, status codes, error codes and worker URLs
are finite sets; request ids and model outputs never become labels.
"""

from __future__ import annotations

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
    "tandem_worker_in_flight", "Requests in flight per worker", ["worker"], registry=REGISTRY
)
WORKER_HEALTHY = Gauge(
    "tandem_worker_healthy",
    "1 when the worker passed its last health check",
    ["worker"],
    registry=REGISTRY,
)
CIRCUIT_OPEN = Gauge(
    "tandem_worker_circuit_open",
    "1 while the worker's circuit breaker is open",
    ["worker"],
    registry=REGISTRY,
)
RETRIES = Counter(
    "tandem_retries_total", "Requests retried on another worker", ["route"], registry=REGISTRY
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
    registry=REGISTRY,
)
REQUESTS_QUEUED = Gauge(
    "tandem_requests_queued",
    "Generation requests waiting for an admission slot",
    registry=REGISTRY,
)
MM_INFLIGHT_BYTES = Gauge(
    "tandem_mm_inflight_bytes",
    "Image bytes held by in-flight requests, decoded or as pixel tensors "
    "(against --multimodal-max-inflight-bytes)",
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
    registry=REGISTRY,
)
MM_POOL_RESTARTS = Counter(
    "tandem_mm_pool_restarts_total",
    "Image pool processes replaced after one died (--mm-workers)",
    registry=REGISTRY,
)
