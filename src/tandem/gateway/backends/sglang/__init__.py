"""SGLang's worker protocol (``sglang.grpc.scheduler.SglangScheduler``), gateway side."""
