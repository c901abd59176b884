"""The vLLM worker protocol (``vllm.grpc.engine.VllmEngine``, from ``smg-grpc-proto``)."""
