"""TensorRT-LLM's protocol (``trtllm.TrtllmService``) on the gateway side: the client and
its labels, the request, the images as their source bytes, the frames, the sender and the
``Backend`` (docs/worker-protocols.md)."""
