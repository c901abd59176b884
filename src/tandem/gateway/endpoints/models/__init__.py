"""``/v1/models``."""
