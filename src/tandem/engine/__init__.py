"""The embedded CPU engine: built-in models, runner, sampling, caches, KV handoff store."""
