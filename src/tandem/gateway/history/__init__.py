"""Stored Responses API conversations: the contract (``store.py``) and its backends."""
