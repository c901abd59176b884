"""Opening worker streams for a request: see ``base.py``."""
