"""The Responses API: stored conversations over the same pipeline."""
