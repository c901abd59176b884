"""The bench report: the table lists every gateway measured, ratios against smg, and the
worker-headroom verdict the issue asks the output to state."""

from __future__ import annotations

from bench.report import _cpu_count, headroom, table


def point(p50: float, rate: float, gw_cpu: float, worker_cpu: float) -> dict:
    c1 = {
        "p50_ms": p50,
        "p99_ms": p50 * 2,
        "gw_cpu_ms_per_req": gw_cpu,
        "worker_cpu_ms_per_req": worker_cpu,
        "legs": {"prefill": {"message_bytes": 100, "pixel_bytes": 0}},
        "media_items_per_image": 1.0,
    }
    points = [{"offered_rate": rate, "achieved_rate": rate}, {"achieved_rate": rate * 1.2}]
    return {"c1": c1, "sweep": {"max_rate": rate, "points": points}}


RESULTS = {
    "args": {"load_cpus": "1"},
    "pd": {
        "short_text": {"tandem": point(5, 150, 3, 4), "smg": point(4, 100, 1, 4)},
        "image_1024_stream": {
            "tandem": point(40, 30, 30, 10),
            "tandem-draft": point(25, 45, 18, 10),
            "smg": point(38, 40, 27, 10),
        },
    },
}


def test_table_has_every_gateway_and_ratio_rows() -> None:
    text = table(RESULTS)
    assert "| image_1024_stream | pd | tandem-draft |" in text
    assert "| image_1024_stream | pd (draft) | 0.66 | 1.12 | 1.12 | 0.67 |" in text
    assert "| short_text | pd | 1.25 | 1.50 | 1.50 | 3.00 |" in text
    assert "| 150.0 (180.0) |" in text  # last passing rate, then the most served at overload


def test_headroom_flags_worker_bound_scenarios() -> None:
    text = headroom(RESULTS)
    # 150 req/s x 4 ms = 60 % of one CPU: 1.7x, below the 3x the issue asks for.
    assert "| short_text | pd | 150.0 | 4.00 | 60% | 1.7× **< 3×: worker-bound** |" in text
    # 45 req/s x 10 ms = 45 %: 2.2x.
    assert "| image_1024_stream | pd | 45.0 | 10.00 | 45% | 2.2× **< 3×" in text
    roomy = {"args": {"load_cpus": "1-3"}, "pd": {"x": {"smg": point(1, 10, 1, 10)}}}
    assert "| x | pd | 10.0 | 10.00 | 3% | 30.0× ok |" in headroom(roomy)


def test_cpu_count_reads_taskset_lists() -> None:
    assert (_cpu_count("1"), _cpu_count("1,3"), _cpu_count("2-5,7")) == (1, 2, 5)
