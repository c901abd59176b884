"""Tandem's gateway and smg side by side, fronting the same null workers, in one run.

    .venv/bin/python -m bench.side_by_side [--quick] [--scenarios a b] [--variants ...]

Gateways run on ``--gateway-cpus``; workers and the load generators on ``--load-cpus``.
Every gateway variant (``bench.variants``) runs the rate sweeps; over the PD workers each
also runs the multi-turn image chat, the mixed load (``bench.chat_mixed``) and vLLM's own
load generator (``bench.vllm_bench``). Results go to ``DIR/results.json``;
``bench/report.py`` turns them into the tables and plots of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from bench import chat_mixed, measure, vllm_bench
from bench.procs import (
    Proc,
    ensure_smg,
    free_port,
    rss_bytes,
    smg_version,
    start_smg,
    start_tandem,
    start_worker,
    wait_ready,
)
from bench.report import _cpu_count, _f
from bench.scenarios import MODEL, SCENARIOS, write_body
from bench.variants import ALL, Variant, variants
from tandem.hostport import split_url

VLLM_HOME = Path(os.environ.get("TANDEM_VLLM_HOME", Path.home() / ".cache/tandem/vllm"))


def start_workers(cpus: str, delay_ms: float) -> dict[str, Proc]:
    started = {role: start_worker(role, cpus, delay_ms, MODEL) for role in ("prefill", "decode")}
    started["both"] = start_worker("both", cpus, delay_ms, MODEL)
    return {role: wait_ready(proc) for role, proc in started.items()}


def start_variant(variant: Variant, urls: dict[str, str], cpus: str) -> Proc:
    if variant.kind == "tandem":
        return start_tandem(urls, cpus, *variant.flags, name=variant.name)
    return start_smg(urls, cpus, free_port(), free_port(), variant.flags, name=variant.name)


def gateways_for(
    mode: str, workers: dict[str, Proc], cpus: str, chosen: list[Variant]
) -> tuple[dict[str, Proc], dict[str, Proc]]:
    roles = ("both",) if mode == "agg" else ("prefill", "decode")
    used = {r: workers[r] for r in roles}
    urls = {r: p.address for r, p in used.items()}
    gws: dict[str, Proc] = {}
    try:
        for variant in chosen:
            gws[variant.name] = start_variant(variant, urls, cpus)
    except BaseException:
        for gw in gws.values():
            gw.stop()
        raise
    return gws, used


def mode_variants(mode: str, chosen: list[Variant], args) -> list[Variant]:
    """Best variants only in ``--best-modes``; the others in every mode."""
    return [v for v in chosen if not v.name.endswith("-best") or mode in args.best_modes]


def run_sweeps(mode: str, gws: dict, used: dict, chosen: list[Variant], args, bodies: Path):
    out: dict = {}
    images_only = {v.name for v in chosen if v.images_only}
    for name in args.scenarios:
        scenario = SCENARIOS[name]
        if mode not in scenario.modes:
            continue
        body = write_body(scenario, bodies)
        res: dict = {}
        here = {n: g for n, g in gws.items() if n not in images_only or scenario.images}
        for gw_name, gw in here.items():
            print(f"[bench] {name}/{mode}/{gw_name}: concurrency 1", flush=True)
            c1 = measure.idle(gw, used, body, args.load_cpus, args.c1_seconds, scenario.images)
            print(f"[bench]   p50 {c1['p50_ms']:.2f} ms; sweeping", flush=True)
            res[gw_name] = {
                "c1": c1,
                "sweep": measure.sweep(gw, body, args.load_cpus, c1, args.point_seconds),
            }
            print(f"[bench]   max {res[gw_name]['sweep']['max_rate']:.1f} req/s", flush=True)
        half = 0.5 * res["smg"]["sweep"]["max_rate"] if "smg" in res else 0.0
        for gw_name, gw in here.items():
            if half > 0:
                res[gw_name]["at_half_smg_max"] = measure.at_rate(
                    gw, body, args.load_cpus, half, args.point_seconds
                )
        out[name] = res
    return out


def run_pd_extras(gws: dict[str, Proc], args, bodies: Path, results: dict, save) -> None:
    """Multi-turn chat, mixed load and ``vllm bench serve``, each against every PD gateway."""
    if not args.skip_chat:
        jpegs = chat_mixed.write_jpegs(bodies, args.chat_base_images, (1024, 1024))
        results["multi_turn"] = {}
        for name, gw in gws.items():
            print(f"[bench] multi-turn image chat/{name}", flush=True)
            r = chat_mixed.multi_turn(gw, jpegs, args.load_cpus, args)
            results["multi_turn"][name] = r
            print(f"[bench]   {r['achieved_rate']:.1f} req/s, {r['error_count']} errors")
        save()
    if not args.skip_mixed:
        results["mixed"] = {}
        for name, gw in gws.items():
            print(f"[bench] mixed load/{name}", flush=True)
            r = chat_mixed.mixed(gw, bodies, args.load_cpus, args)
            results["mixed"][name] = r
            a = r["text_alone"]["stream_timing"]["tpot_p50_ms"]
            b = r["text_with_images"]["stream_timing"]["tpot_p50_ms"]
            print(f"[bench]   text TPOT p50 {_f(a, 3)} ms alone, {_f(b, 3)} with images")
        save()
    if not args.skip_vllm:
        python = VLLM_HOME / "venv" / "bin" / "python"
        if not (VLLM_HOME / "venv" / "bin" / "vllm").exists():
            results["vllm_bench"] = {
                "skipped": f"no vLLM venv at {VLLM_HOME / 'venv'}; "
                "build it with `.venv/bin/python -m tests.compat.vllm_env`"
            }
            print(f"[bench] {results['vllm_bench']['skipped']}", flush=True)
            return
        from tandem.engine.builtin import resolve_model

        print("[bench] vllm bench serve against every PD gateway", flush=True)
        results["vllm_bench"] = vllm_bench.run_all(
            python,
            gws,
            resolve_model(MODEL, weights=False),
            MODEL,
            args.vllm_datasets,
            args.vllm_prompts,
            args.vllm_concurrency,
            args.load_cpus,
            timeout=args.vllm_timeout,
        )
        save()


def rss_levels(gateway: Proc, body: Path, cpus: str, levels: list[int], seconds: float) -> dict:
    port = split_url(gateway.address, "http")[1]
    baseline = rss_bytes(gateway.pid)
    points = []
    for level in levels:
        peak = [0]
        stop = threading.Event()

        def sample(peak: list[int] = peak, stop: threading.Event = stop) -> None:
            while not stop.is_set():
                peak[0] = max(peak[0], rss_bytes(gateway.pid))
                time.sleep(0.02)

        thread = threading.Thread(target=sample)
        thread.start()
        result = measure.loadgen(
            cpus, port, body, mode="closed", concurrency=level, duration_s=seconds
        )
        stop.set()
        thread.join()
        points.append({"in_flight": level, "peak_rss_mb": peak[0] / 2**20, "load": result})
    xs = [p["in_flight"] for p in points]
    ys = [p["peak_rss_mb"] for p in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )
    return {"baseline_rss_mb": baseline / 2**20, "points": points, "slope_mb_per_image": slope}


def run_rss(args, chosen: list[Variant], bodies: Path) -> dict:
    workers = start_workers(args.load_cpus, args.slow_token_ms)
    try:
        rss_variants = [v for v in mode_variants("pd", chosen, args) if v.name != "tandem-draft"]
        gws, _ = gateways_for("pd", workers, args.gateway_cpus, rss_variants)
        body = write_body(SCENARIOS["image_1024_stream"], bodies, max_tokens=args.slow_tokens)
        try:
            return {
                name: rss_levels(gw, body, args.load_cpus, [1, 8, 32], args.rss_seconds)
                for name, gw in gws.items()
            }
        finally:
            for gw in gws.values():
                gw.stop()
    finally:
        for w in workers.values():
            w.stop()


def machine() -> dict:
    cpu = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        ),
        platform.processor(),
    )
    mem = Path("/proc/meminfo").read_text().split()[1]
    tandem = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    return {
        "cpu": cpu,
        "cpus": len(os.sched_getaffinity(0)),
        "mem_gib": round(int(mem) / 2**20, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "smg": smg_version(),
        "tandem_commit": tandem,
    }


QUICK = {
    "scenarios": ["short_text", "image_1024_stream"],
    "modes": ["pd"],
    "c1_seconds": 1.0,
    "point_seconds": 1.5,
    "skip_rss": True,
    "chat_seconds": 4.0,
    "mixed_seconds": 3.0,
    "vllm_prompts": 24,
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smoke run (< 4 min): " + str(QUICK))
    p.add_argument("--scenarios", nargs="*", default=list(SCENARIOS))
    p.add_argument("--modes", nargs="*", default=["agg", "pd"])
    p.add_argument("--variants", nargs="*", default=list(ALL), help=", ".join(ALL))
    p.add_argument("--best-modes", nargs="*", default=["pd"], help="modes of the -best variants")
    p.add_argument("--pixel-cache-mb", type=int, default=256, help="both -best variants")
    p.add_argument("--mm-workers", type=int, default=0, help="tandem-best; 0: gateway CPUs")
    p.add_argument("--c1-seconds", type=float, default=3.0)
    p.add_argument("--point-seconds", type=float, default=3.0)
    p.add_argument("--gateway-cpus", default="0")
    p.add_argument("--load-cpus", default="1")
    p.add_argument("--slow-token-ms", type=float, default=20.0)
    p.add_argument("--slow-tokens", type=int, default=50)
    p.add_argument("--rss-seconds", type=float, default=4.0)
    p.add_argument("--skip-rss", action="store_true")
    p.add_argument("--no-draft-variant", action="store_true", help="drop tandem-draft")
    p.add_argument("--skip-chat", action="store_true")
    p.add_argument("--chat-seconds", type=float, default=10.0)
    p.add_argument("--chat-concurrency", type=int, default=4)
    p.add_argument("--chat-base-images", type=int, default=8)
    p.add_argument("--skip-mixed", action="store_true")
    p.add_argument("--mixed-seconds", type=float, default=6.0)
    p.add_argument("--mixed-text-rate", type=float, default=8.0, help="text streams per s")
    p.add_argument("--mixed-image-rate", type=float, default=8.0, help="image requests per s")
    p.add_argument("--skip-vllm", action="store_true")
    p.add_argument("--vllm-datasets", nargs="*", default=["random-mm", "random"])
    p.add_argument("--vllm-prompts", type=int, default=160)
    p.add_argument("--vllm-concurrency", type=int, default=8)
    p.add_argument("--vllm-timeout", type=float, default=420.0)
    p.add_argument("--out", type=Path, default=Path("docs/benchmarks"))
    args = p.parse_args(argv)
    if args.quick:
        for name, value in QUICK.items():
            setattr(args, name, value)
        args.no_draft_variant = True
    if args.no_draft_variant:
        args.variants = [v for v in args.variants if v != "tandem-draft"]
    if "smg" not in args.variants:
        p.error("the smg variant is the reference of every ratio; keep it")
    if not args.mm_workers:
        args.mm_workers = _cpu_count(args.gateway_cpus)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    ensure_smg()
    chosen = variants(args.variants, args.pixel_cache_mb, args.mm_workers)
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    results: dict = {
        "machine": machine(),
        "args": {k: str(v) for k, v in vars(args).items()},
        "variants": {v.name: {"kind": v.kind, "flags": list(v.flags)} for v in chosen},
    }

    def save() -> None:
        results["elapsed_s"] = round(time.monotonic() - started, 1)
        (args.out / "results.json").write_text(json.dumps(results, indent=1))

    with tempfile.TemporaryDirectory(prefix="tandem-bench-") as tmp:
        workers = start_workers(args.load_cpus, 0.0)
        try:
            modes = list(args.modes) + ([] if "pd" in args.modes else ["pd-extras"])
            for mode in modes:
                real = "pd" if mode == "pd-extras" else mode
                here = mode_variants(real, chosen, args)
                gws, used = gateways_for(real, workers, args.gateway_cpus, here)
                try:
                    if mode != "pd-extras":
                        results[mode] = run_sweeps(mode, gws, used, here, args, Path(tmp))
                        save()
                    if real == "pd":
                        run_pd_extras(gws, args, Path(tmp), results, save)
                finally:
                    for gw in gws.values():
                        gw.stop()
        finally:
            for w in workers.values():
                w.stop()
        if not args.skip_rss:
            print("[bench] RSS per in-flight image (slow workers)", flush=True)
            results["rss"] = run_rss(args, chosen, Path(tmp))
    save()
    print(f"[bench] wrote {args.out / 'results.json'} in {results['elapsed_s']:.0f}s", flush=True)


if __name__ == "__main__":
    main()
