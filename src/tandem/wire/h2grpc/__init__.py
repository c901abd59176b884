"""A small gRPC client over HTTP/2 for the gateway's hot unary-stream calls (``Generate``).

grpc.aio costs about 0.6 ms of CPU per call and 0.1 ms per streamed message on this
project's machines (docs/benchmarks.md, "The floor under every leg"), most of it in grpc
core's call set-up and its poller thread. This client parses HTTP/2 frames on the event
loop itself: no extra thread, no per-message wake-up. It speaks plaintext HTTP/2 (h2c
with prior knowledge) only, as the gateway's worker channels do; every other call (health,
info, tokenizer, KV events, aborts) stays on grpc.aio. docs/architecture.md says where
it is used and how to turn it off (``--worker-stream-client grpcio``).
"""
