"""Keep torch out of the gateway process.

The gateway never runs a model, but transformers imports torch whenever it is
installed (the worker's extra installs it into the same environment). Marking
torch as absent before transformers loads makes its PIL image processors run
on numpy alone, which saves the gateway hundreds of MiB and seconds of start-up.
"""

from __future__ import annotations

import sys


def block_torch() -> None:
    """Make ``import torch`` fail in this process; call before anything imports transformers."""
    if "transformers" in sys.modules or sys.modules.get("torch") is not None:
        return  # too late to change what transformers saw; leave the process as it is
    for name in ("torch", "torchvision", "torchaudio"):
        # A None entry is Python's documented way to make an import fail; typeshed types the
        # dict as holding modules only.
        sys.modules[name] = None  # type: ignore[assignment]
