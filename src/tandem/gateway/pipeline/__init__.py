"""Named stages over one request context: prompt → media → request → dispatch → respond."""
