"""Tandem's worker speaking MLX's protocol (``mlx.grpc.engine.MlxEngine``, ``--protocol mlx``):
the only worker code that reads MLX's messages (tests/unit/test_protocol_boundary.py)."""
