"""OpenAI-compatible HTTP edge: request schemas, response bodies, SSE framing."""
