"""The image pool's forkserver preload: everything a pool process needs, imported once.

Importing this module in the forkserver (gateway/multimodal/pool.py) means each pool
process forked from it starts with numpy, Pillow and the transformers PIL image processors
already loaded, and with torch blocked.
"""

from __future__ import annotations

import contextlib

from tandem.gateway.torchless import block_torch

# Before anything imports transformers: pool processes are as torch-free as the gateway
# (gateway/torchless.py). Only the forkserver imports this module, never the gateway.
block_torch()

import tandem.gateway.multimodal.pool_worker  # noqa: E402, F401

# The classes a pickled ImageProcessor refers to (models/processor.py load_processor);
# without them the first image of each pool process would pay transformers' import.
with contextlib.suppress(ImportError):
    import transformers.models.clip.image_processing_pil_clip
    import transformers.models.qwen2_vl.image_processing_pil_qwen2_vl  # noqa: F401
