"""``/health``, ``/metrics``, ``/openapi.json``."""
