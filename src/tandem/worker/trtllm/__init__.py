"""The worker's TensorRT-LLM adapter: ``trtllm.TrtllmService`` over Tandem's ``Engine``.

Everything that reads or writes TensorRT-LLM's messages on the worker side is here
(docs/architecture.md, "Add a worker protocol"). The protocol carries whole requests only
(no PD: its answers return no context-phase parameters) and images as their source bytes,
which this worker decodes and preprocesses itself (docs/worker-protocols.md).
"""
