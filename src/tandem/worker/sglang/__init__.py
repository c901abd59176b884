"""The worker's SGLang adapter: ``sglang.grpc.scheduler.SglangScheduler`` over Tandem's ``Engine``.

Everything that reads or writes SGLang's messages on the worker side is here; PD meets
at SGLang's bootstrap rooms over Tandem's KV side channel (docs/architecture.md, "Add a
worker protocol").
"""
