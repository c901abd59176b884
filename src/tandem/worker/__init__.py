"""The embedded worker: a VllmEngine gRPC servicer over the engine, and the KV side channel."""
