"""A cross-check with an independent client: ``vllm bench serve`` against every gateway.

vLLM's own load generator (from the compat lane's venv, ``tests/compat/vllm_env.py``) sends
chat completions (``--backend openai-chat``) at a fixed concurrency: ``random`` (text) and
``random-mm`` (one 1024×1024 image a request). Its result lines (throughput, TTFT, TPOT,
ITL) are parsed into results.json and quoted in docs/benchmarks.md.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from bench.procs import Proc

DRIVER = Path(__file__).with_name("vllm_driver.py")
RESULT_START = re.compile(r"^=+ Serving Benchmark Result =+$")
RESULT_LINE = re.compile(r"^(?P<label>[^:=]+?):\s+(?P<value>-?\d+(?:\.\d+)?)\s*$")
RUN_LINE = re.compile(r"^TANDEM-BENCH (RUN|FAILED) (\S+?)(?::.*)?$")


def dataset_argv(dataset: str, prompts: int) -> list[str]:
    if dataset == "random":
        return [
            "--dataset-name", "random",
            "--random-input-len", "128",
            "--random-output-len", "64",
            "--num-prompts", str(prompts),
        ]  # fmt: skip
    if dataset == "random-mm":
        return [
            "--dataset-name", "random-mm",
            "--random-input-len", "64",
            "--random-output-len", "16",
            "--random-mm-base-items-per-request", "1",
            "--random-mm-num-mm-items-range-ratio", "0",
            "--random-mm-limit-mm-per-prompt", '{"image": 1, "video": 0}',
            "--random-mm-bucket-config", "{(1024, 1024, 1): 1.0}",
            "--num-prompts", str(prompts),
        ]  # fmt: skip
    raise ValueError(f"unknown dataset {dataset!r}")


def run_argv(gateway: Proc, tokenizer: Path, model: str, dataset: str, prompts: int, conc: int):
    return [
        "--backend", "openai-chat",
        "--base-url", gateway.address,
        "--endpoint", "/v1/chat/completions",
        "--model", model,
        "--tokenizer", str(tokenizer),
        "--max-concurrency", str(conc),
        "--seed", "0",
        "--disable-tqdm",
        "--percentile-metrics", "ttft,tpot,itl,e2el",
        "--metric-percentiles", "50,99",
        *dataset_argv(dataset, prompts),
    ]  # fmt: skip


def key(label: str) -> str:
    """``Mean TPOT (ms)`` → ``mean_tpot_ms``; ``Request throughput (req/s)`` →
    ``request_throughput_req_s``."""
    return re.sub(r"[^a-z0-9]+", "_", label.lower()).strip("_")


def parse_output(text: str) -> dict[str, dict]:
    """Per run label: its result lines as numbers (``metrics``), the lines themselves
    (``lines``) and, for a run that failed or printed no result, ``error``."""
    runs: dict[str, dict] = {}
    current: dict | None = None
    in_result = False
    for raw in text.splitlines():
        line = raw.rstrip()
        run = RUN_LINE.match(line)
        if run:
            kind, label = run.groups()
            if kind == "RUN":
                current = runs.setdefault(label, {"metrics": {}, "lines": []})
                in_result = False
            else:
                runs.setdefault(label, {"metrics": {}, "lines": []})["error"] = line
            continue
        if current is None:
            continue
        if RESULT_START.match(line):
            in_result = True
            continue
        if in_result and line.startswith("=") and set(line) == {"="}:
            in_result = False
            continue
        match = RESULT_LINE.match(line) if in_result else None
        if match:
            current["lines"].append(line)
            current["metrics"][key(match["label"])] = float(match["value"])
    for result in runs.values():
        if not result["metrics"] and "error" not in result:
            result["error"] = "no result lines"
    return runs


def run_all(
    vllm_python: Path,
    gateways: dict[str, Proc],
    tokenizer: Path,
    model: str,
    datasets: list[str],
    prompts: int,
    concurrency: int,
    cpus: str,
    timeout: float,
) -> dict:
    """Every (gateway, dataset) run in one driver process; results keyed gateway → dataset."""
    runs = [
        {
            "label": f"{name}/{dataset}",
            "argv": run_argv(gw, tokenizer, model, dataset, prompts, concurrency),
        }
        for name, gw in gateways.items()
        for dataset in datasets
    ]
    argv = ["taskset", "-c", cpus, str(vllm_python), str(DRIVER), json.dumps(runs)]
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        text, tail = out.stdout, out.stderr[-2000:]
    except subprocess.TimeoutExpired as exc:
        text = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        tail = f"timed out after {timeout:.0f}s"
    parsed = parse_output(text)
    results: dict[str, dict] = {}
    for run in runs:
        name, dataset = run["label"].split("/", 1)
        got = parsed.get(run["label"], {"metrics": {}, "lines": [], "error": "did not run"})
        if "error" in got:
            got["stderr_tail"] = tail
        results.setdefault(name, {})[dataset] = got
    return {"concurrency": concurrency, "prompts": prompts, "runs": results}
