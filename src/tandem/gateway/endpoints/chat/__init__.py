"""``POST /v1/chat/completions``."""
