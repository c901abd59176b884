"""The gateway's model logic runs without torch: prove it in a process where torch is absent."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# Makes torch look uninstalled: transformers' availability probe sees no spec,
# and any direct import of torch or a submodule fails.
_BLOCK_TORCH = """
import importlib.abc
import sys

class _NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "torchvision"):
            raise ImportError(f"{name} is blocked in this test")
        return None

sys.meta_path.insert(0, _NoTorch())
sys.modules["torch"] = None
sys.modules["torchvision"] = None
"""

_SCRIPT = """
try:
    import torch
except ImportError:
    pass
else:
    raise AssertionError("the torch blocker does not work")

from pathlib import Path
from PIL import Image

from tandem.engine.builtin import generate_builtin, resolve_model
from tandem.models import (
    expand_placeholders, load_model_info, load_processor, render_chat,
)

root = Path(sys.argv[1])
for name in ("tiny-qwen3-vl", "tiny-llava-1.5"):
    model_dir = resolve_model(name, weights=False, cache_root=root)
    info = load_model_info(model_dir)
    text = render_chat(model_dir, [{"role": "user", "content": [{"type": "image"}]}])
    from tokenizers import Tokenizer
    ids = Tokenizer.from_file(str(model_dir / "tokenizer.json")).encode(
        text, add_special_tokens=False
    ).ids
    pre = load_processor(model_dir).preprocess([Image.new("RGB", (200, 120), (9, 99, 199))])
    expanded, ranges = expand_placeholders(
        ids, info.anchor_token_id, pre.tokens_per_image, info.image_token_id
    )
    assert len(ranges) == 1 and pre.pixel_values.dtype.name == "float32"
    from transformers import AutoTokenizer
    assert AutoTokenizer.from_pretrained(model_dir)(text)["input_ids"] == ids
    # Full checkpoints too: their weights are copied from the package, never trained.
    full = generate_builtin(name, root / "full")
    assert (full / "model.safetensors").stat().st_size > 100_000

loaded = [m for m, mod in sys.modules.items() if m.split(".")[0] == "torch" and mod is not None]
assert not loaded, loaded
print("torch-free OK")
"""


@pytest.mark.processes
def test_models_package_and_weightless_builtins_need_no_torch(tmp_path: Path) -> None:
    script = _BLOCK_TORCH + "\n" + textwrap.dedent(_SCRIPT)
    result = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "torch-free OK" in result.stdout
