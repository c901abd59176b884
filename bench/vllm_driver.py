"""Runs several ``vllm bench serve`` benchmarks in one process of the vLLM venv.

    ~/.cache/tandem/vllm/venv/bin/python bench/vllm_driver.py RUNS_JSON

``RUNS_JSON`` is a list of ``{"label", "argv"}`` (the arguments after ``vllm bench serve``).
Importing vLLM takes tens of seconds on this machine, so one process runs them all; each
run's output follows a ``TANDEM-BENCH RUN <label>`` line. If vLLM's benchmark module cannot
be imported this way, each run falls back to the ``vllm`` command itself. No Tandem import:
this file runs under the vLLM venv's interpreter.
"""

from __future__ import annotations

import json
import subprocess
import sys
import traceback
from pathlib import Path


def main(runs: list[dict]) -> None:
    try:
        from vllm.benchmarks.serve import add_cli_args
        from vllm.benchmarks.serve import main as serve_main
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:
        add_cli_args = None  # type: ignore[assignment]
    for run in runs:
        print(f"TANDEM-BENCH RUN {run['label']}", flush=True)
        if add_cli_args is None:
            vllm = Path(sys.executable).with_name("vllm")
            subprocess.run([str(vllm), "bench", "serve", *run["argv"]], check=False)
            continue
        try:
            parser = FlexibleArgumentParser()
            add_cli_args(parser)
            serve_main(parser.parse_args(run["argv"]))
        except (Exception, SystemExit) as exc:  # one failed run must not hide the others
            traceback.print_exc(file=sys.stdout)
            print(f"TANDEM-BENCH FAILED {run['label']}: {exc!r}", flush=True)
        sys.stdout.flush()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
