"""The HTTP edge: the application, inbound requests, access control, JSON and SSE framing,
rendering a pipeline outcome."""
