"""MLX's worker protocol (``mlx.grpc.engine.MlxEngine``) on the gateway side: text only, one
sample per request, no constraint, no PD (docs/worker-protocols.md)."""
