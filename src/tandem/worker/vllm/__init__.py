"""The worker's vLLM adapter: ``vllm.grpc.engine.VllmEngine`` over Tandem's ``Engine``.

Everything that reads or writes vLLM's messages on the worker side is here; the engine,
the KV side channel, the compile pool and the media limits below are the protocols'
common parts (docs/architecture.md, "Add a worker protocol").
"""
