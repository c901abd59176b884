"""``POST /v1/completions`` (OpenAI's legacy API)."""
