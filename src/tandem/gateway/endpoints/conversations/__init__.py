"""The Conversations API (``/v1/conversations``): stored conversations and their items."""
