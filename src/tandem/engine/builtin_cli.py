"""`tandem models`: the built-in models' shipped weights, checked and retrained.

``tandem models check`` says whether each shipped checkpoint still fits the recipe in the
code; ``tandem models train NAME`` trains one from its seed (minutes, a progress bar),
into ``--out DIR`` and/or, with ``--ship``, into the package's shipped weights
(engine/builtin_shipped.py), which a developer then commits.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tandem.engine.builtin import BUILTIN_MODELS, train_checkpoint
from tandem.engine.builtin_shipped import (
    SHIPPED_DIR,
    StaleWeightsError,
    ship_weights,
    shipped_weights,
)
from tandem.engine.builtin_specs import BUILTIN_SPECS


def add_models_parser(commands: Any) -> None:
    parser = commands.add_parser("models", help="check or retrain the built-in models")
    verbs = parser.add_subparsers(dest="models_command", required=True)
    check = verbs.add_parser("check", help="do the shipped weights fit the code's recipes?")
    check.set_defaults(run=run_check)
    train = verbs.add_parser("train", help="train a built-in model from its seed (minutes)")
    train.add_argument("name", choices=BUILTIN_MODELS)
    train.add_argument("--out", type=Path, help="write the whole checkpoint to this new directory")
    train.add_argument(
        "--ship", action="store_true", help=f"make its weights the shipped ones ({SHIPPED_DIR})"
    )
    train.set_defaults(run=run_train)


def run_check(args: argparse.Namespace) -> int:
    stale = 0
    for name in BUILTIN_MODELS:
        try:
            weights = shipped_weights(BUILTIN_SPECS[name])
        except StaleWeightsError as exc:
            stale += 1
            print(f"{name}: {exc}")
        else:
            print(f"{name}: shipped weights fit recipe {weights.key} ({weights.sha256[:12]})")
    return 1 if stale else 0


def run_train(args: argparse.Namespace) -> int:
    if args.out is None and not args.ship:
        print("tandem models train: give --out DIR, --ship, or both", file=sys.stderr)
        return 2
    scratch = None if args.out is not None else Path(tempfile.mkdtemp(prefix="tandem-train-"))
    out = args.out if args.out is not None else scratch / args.name
    started = time.monotonic()
    try:
        try:
            train_checkpoint(args.name, out)
        except FileExistsError as exc:  # checked before anything is trained
            print(f"tandem models train: {exc}", file=sys.stderr)
            return 2
        print(f"tandem: trained {args.name} in {time.monotonic() - started:.0f} s", file=sys.stderr)
        if args.out is not None:
            print(f"tandem: checkpoint written to {out}", file=sys.stderr)
        if args.ship:
            target = ship_weights(out, BUILTIN_SPECS[args.name])
            print(f"tandem: shipped weights written to {target}; commit them", file=sys.stderr)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    return 0
