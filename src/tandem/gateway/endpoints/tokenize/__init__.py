"""``POST /tokenize`` and ``POST /detokenize`` (vLLM's), through the pipeline's gates."""
