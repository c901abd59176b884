"""One scenario against one gateway: closed loop at concurrency 1, an open-loop rate sweep,
CPU seconds per request, bytes per PD leg read at the workers, and media items per image."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import grpc

from bench.procs import Proc, cpu_seconds, http_get
from tandem.hostport import split_url

ROOT = Path(__file__).resolve().parents[1]  # the load generator runs as ``-m bench.loadgen``
P99_FACTOR = 5.0  # a rate passes while p99 < 5 x idle p99 ...
MAX_ERROR_RATE = 0.001  # ... and errors < 0.1 %


def loadgen_argv(cpus: str, port: int, body: Path | None, **spec) -> tuple[list[str], float]:
    """The command line of one load-generator run, and how long to let it take at most."""
    spec = {"port": port, "body": str(body), "timeout_s": 15.0, **spec}
    limit = spec.get("duration_s", 5) + spec["timeout_s"] + 30
    argv = ["taskset", "-c", cpus, sys.executable, "-m", "bench.loadgen", json.dumps(spec)]
    return argv, limit


def loadgen(cpus: str, port: int, body: Path | None, **spec) -> dict:
    argv, limit = loadgen_argv(cpus, port, body, **spec)
    out = subprocess.run(argv, capture_output=True, text=True, timeout=limit, check=True, cwd=ROOT)
    return json.loads(out.stdout)


def worker_stats(address: str) -> dict:
    with grpc.insecure_channel(address) as channel:
        rpc = channel.unary_unary(
            "/tandem.kv.KvTransfer/Stats",
            request_serializer=lambda v: json.dumps(v).encode(),
            response_deserializer=json.loads,
        )
        return rpc({}, timeout=10)


def tandem_mm_items(gateway: Proc) -> float:
    text = http_get(f"{gateway.address}/metrics")
    return sum(float(m) for m in re.findall(r"^tandem_mm_items_total\{[^}]*\} (\S+)", text, re.M))


def _snapshot(gateway: Proc, workers: dict[str, Proc]) -> dict:
    stats = {role: worker_stats(w.address) for role, w in workers.items()}
    return {
        "gw_cpu": cpu_seconds(gateway.pid),
        "worker_cpu": sum(cpu_seconds(w.pid) for w in workers.values()),
        "legs": {role: s.get("leg_bytes", {}) for role, s in stats.items()},
        "worker_media": sum(s.get("media_items_processed", 0) for s in stats.values()),
        "gw_media": tandem_mm_items(gateway) if gateway.name.startswith("tandem") else None,
    }


def _leg_delta(before: dict, after: dict, n: int) -> dict:
    out: dict[str, dict[str, float]] = {}
    for role, legs in after["legs"].items():
        for leg, counts in legs.items():
            prev = before["legs"].get(role, {}).get(leg, {})
            reqs = counts["requests"] - prev.get("requests", 0)
            if reqs <= 0:
                continue
            out[leg] = {
                "requests_per_request": reqs / n,
                "message_bytes": (counts["message_bytes"] - prev.get("message_bytes", 0)) / n,
                "pixel_bytes": (counts["pixel_bytes"] - prev.get("pixel_bytes", 0)) / n,
                # of which through /dev/shm (--multimodal-tensor-transport), not the message
                "shm_bytes": (counts.get("shm_bytes", 0) - prev.get("shm_bytes", 0)) / n,
            }
    return out


def idle(
    gateway: Proc, workers: dict[str, Proc], body: Path, cpus: str, seconds: float, images: int
):
    port = split_url(gateway.address, "http")[1]
    loadgen(cpus, port, body, mode="closed", concurrency=1, duration_s=1.0, max_requests=50)
    before = _snapshot(gateway, workers)
    c1 = loadgen(cpus, port, body, mode="closed", concurrency=1, duration_s=seconds)
    after = _snapshot(gateway, workers)
    n = max(c1["ok"] + c1["error_count"], 1)
    c1["gw_cpu_ms_per_req"] = 1000 * (after["gw_cpu"] - before["gw_cpu"]) / n
    c1["worker_cpu_ms_per_req"] = 1000 * (after["worker_cpu"] - before["worker_cpu"]) / n
    c1["legs"] = _leg_delta(before, after, n)
    if images:
        media = after["worker_media"] - before["worker_media"]
        if after["gw_media"] is not None:
            media += after["gw_media"] - before["gw_media"]
            c1["media_items_per_image"] = media / (n * images)
        else:
            c1["worker_media_items_per_image"] = media / (n * images)
    return c1


def sweep(gateway: Proc, body: Path, cpus: str, idle_result: dict, seconds: float) -> dict:
    """Offered rates rising 1.5x from half the closed-loop rate until a point fails."""
    port = split_url(gateway.address, "http")[1]
    limit_p99 = P99_FACTOR * (idle_result["p99_ms"] or 1.0)
    rate = max(0.5, 0.5 * 1000.0 / (idle_result["mean_ms"] or 1000.0))
    points, best, why = [], 0.0, "rate cap"
    for _ in range(12):
        point = loadgen(cpus, port, body, mode="open", rate=round(rate, 2), duration_s=seconds)
        points.append(point)
        sent = max(point["sent"] + point["errors"].get("overload_outstanding_cap", 0), 1)
        err_rate = point["error_count"] / sent
        generator_late = (point["send_s"] or 0) > 1.05 * seconds + 0.05
        p99 = point["p99_ms"] or float("inf")
        point["pass"] = err_rate < MAX_ERROR_RATE and p99 < limit_p99 and not generator_late
        if generator_late:
            why = "load generator could not keep the schedule"
            break
        if not point["pass"]:
            why = f"p99 {p99:.1f} ms (limit {limit_p99:.1f}) or errors {err_rate:.2%}"
            break
        best = rate
        rate *= 1.5
        if rate > 5000:
            break
    return {"max_rate": best, "stopped_by": why, "points": points, "p99_limit_ms": limit_p99}


def at_rate(gateway: Proc, body: Path, cpus: str, rate: float, seconds: float) -> dict:
    port = split_url(gateway.address, "http")[1]
    return loadgen(cpus, port, body, mode="open", rate=round(rate, 2), duration_s=seconds)
