"""The gateway variants the bench runs side by side (docs/benchmarks.md, "Variants").

- ``tandem``: Tandem's gateway with its defaults; ``smg``: smg with the settings of the first
  runs (inline tensors, no pixel cache): the like-for-like pair.
- ``tandem-best`` / ``smg-best``: each at its best same-host settings: shared-memory tensor
  transport and a pixel cache (Tandem also ``--mm-workers``). A flag is passed only when the
  gateway's ``--help`` lists it, so the bench runs against a Tandem that lacks some of them
  (the variant then records which flags it really got).
- ``tandem-draft``: Tandem with ``--mm-jpeg-draft`` (inexact pixels; an operator's choice).

Best and draft variants are measured on image scenarios only: none of their flags touches a
text-only request.
"""

from __future__ import annotations

import functools
import subprocess
import sys
from dataclasses import dataclass

from bench.procs import SMG_INLINE, ensure_smg


@dataclass(frozen=True)
class Variant:
    name: str
    kind: str  # "tandem" or "smg"
    flags: tuple[str, ...] = ()
    images_only: bool = False


@functools.cache
def _help(kind: str) -> str:
    if kind == "tandem":
        argv = [sys.executable, "-m", "tandem.cli", "gateway", "--help"]
    else:
        argv = [str(ensure_smg()), "launch", "--help"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    return out.stdout + out.stderr


def supported(kind: str, pairs: list[tuple[str, str]], help_text: str | None = None) -> tuple:
    """The ``(flag, value)`` pairs whose flag the gateway's help lists, flattened."""
    text = _help(kind) if help_text is None else help_text
    out: list[str] = []
    for flag, value in pairs:
        if _lists(text, flag):
            out += [flag, value]
    return tuple(out)


def _lists(help_text: str, flag: str) -> bool:
    """Whether ``flag`` appears in ``help_text`` as a whole option name."""
    start = 0
    while (at := help_text.find(flag, start)) >= 0:
        end = at + len(flag)
        before = help_text[at - 1] if at else " "
        after = help_text[end] if end < len(help_text) else " "
        if not (before.isalnum() or before in "-_") and not (after.isalnum() or after in "-_"):
            return True
        start = end
    return False


def tandem_best_pairs(cache_mb: int, mm_workers: int) -> list[tuple[str, str]]:
    return [
        ("--multimodal-tensor-transport", "shm"),
        ("--mm-pixel-cache-mb", str(cache_mb)),
        ("--mm-workers", str(mm_workers)),
    ]


def smg_best_pairs(cache_mb: int) -> list[tuple[str, str]]:
    return [("--multimodal-tensor-transport", "shm"), ("--mm-pixel-cache-mb", str(cache_mb))]


SMG_DEFAULT = SMG_INLINE

ALL = ("tandem", "tandem-best", "tandem-draft", "smg", "smg-best")


def variants(names: list[str], cache_mb: int, mm_workers: int) -> list[Variant]:
    """The requested variants, in the order of ``ALL``; smg first runs need ``smg``."""
    table = {
        "tandem": lambda: Variant("tandem", "tandem"),
        "tandem-best": lambda: Variant(
            "tandem-best",
            "tandem",
            supported("tandem", tandem_best_pairs(cache_mb, mm_workers)),
            images_only=True,
        ),
        "tandem-draft": lambda: Variant(
            "tandem-draft", "tandem", ("--mm-jpeg-draft",), images_only=True
        ),
        "smg": lambda: Variant("smg", "smg", SMG_DEFAULT),
        "smg-best": lambda: Variant(
            "smg-best", "smg", supported("smg", smg_best_pairs(cache_mb)), images_only=True
        ),
    }
    unknown = set(names) - set(ALL)
    if unknown:
        raise SystemExit(f"unknown variants {sorted(unknown)}; choose from {', '.join(ALL)}")
    return [table[n]() for n in ALL if n in names]


# Which variant each one is compared with in the ratio rows (Tandem/smg).
PAIRS = (("tandem", "smg"), ("tandem-draft", "smg"), ("tandem-best", "smg-best"))
