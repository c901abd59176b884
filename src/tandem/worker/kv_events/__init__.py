"""The worker's KV-event publisher and its ``SubscribeKvEvents`` stream (issue 36)."""
