"""The router/worker path decision (docs/pd-contract.md §3), the worker-path selection checks (§5)
and the plan's limits. Pure functions: no network, no models."""

from __future__ import annotations

import pytest

from tandem.errors import TandemError
from tandem.gateway.multimodal import (
    PathDecision,
    accepted_media_ref_schemes,
    check_legs_accept_media_refs,
    check_media_ref_schemes,
    choose_mm_path,
    filter_media_ref_capable,
    parse_scheme_label,
    plan_images,
)

YES, NO = True, False

# (mode, forwardable, expandable, workers' accepts_media_refs) → (path, reason)
DECISIONS = [
    # router mode: always router, whatever else holds
    ("router", YES, YES, [YES, YES], "router", "config"),
    ("router", NO, NO, [], "router", "config"),
    # worker mode without blockers: worker; capability is enforced at selection, not here
    ("worker", YES, YES, [NO, NO], "worker", "config"),
    ("worker", YES, YES, [], "worker", "config"),
    # auto, in the order of docs/pd-contract.md §3
    ("auto", NO, YES, [YES], "router", "plan_not_forwardable"),
    ("auto", NO, NO, [], "router", "plan_not_forwardable"),
    ("auto", YES, NO, [YES, YES], "router", "model_not_opted_in"),
    ("auto", YES, YES, [], "router", "auto_none"),
    ("auto", YES, YES, [YES], "worker", "auto_uniform"),
    ("auto", YES, YES, [YES, YES, YES], "worker", "auto_uniform"),
    ("auto", YES, YES, [YES, NO], "router", "auto_mixed"),
    ("auto", YES, YES, [NO], "router", "auto_mixed"),
]


@pytest.mark.parametrize(("mode", "fwd", "expandable", "workers", "path", "reason"), DECISIONS)
def test_path_decision_table(
    mode: str, fwd: bool, expandable: bool, workers: list[bool], path: str, reason: str
) -> None:
    decision = choose_mm_path(
        mode, forwardable=fwd, worker_expandable=expandable, workers_accept_media_refs=workers
    )
    assert decision == PathDecision(path, reason)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("fwd", "expandable", "code"),
    [
        (NO, YES, "multimodal_not_supported"),
        (NO, NO, "multimodal_not_supported"),  # the plan blocker is checked first
        (YES, NO, "multimodal_worker_processing_unsupported_model"),
    ],
)
def test_worker_mode_blockers_are_400(fwd: bool, expandable: bool, code: str) -> None:
    with pytest.raises(TandemError) as info:
        choose_mm_path(
            "worker", forwardable=fwd, worker_expandable=expandable, workers_accept_media_refs=[]
        )
    assert (info.value.code, info.value.status, info.value.retryable) == (code, 400, False)


def test_unknown_mode_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="unknown --mm-processing mode"):
        choose_mm_path(
            "sometimes", forwardable=YES, worker_expandable=YES, workers_accept_media_refs=[YES]
        )


def test_plan_keeps_authored_order_and_is_forwardable() -> None:
    urls = ["https://b.test/2.png", "data:image/png;base64,AAAA", "https://a.test/1.png"]
    plan = plan_images(urls, limit=3)
    assert plan.image_urls == tuple(urls)
    assert len(plan) == 3 and plan.forwardable and not plan.is_empty


def test_plan_over_the_limit_is_400_too_many_items() -> None:
    with pytest.raises(TandemError) as info:
        plan_images(["https://a.test/1.png"] * 3, limit=2)
    assert (info.value.code, info.value.status) == ("multimodal_too_many_items", 400)
    assert "3 images" in info.value.message and "at most 2" in info.value.message
    assert len(plan_images(["https://a.test/1.png"] * 50, limit=None)) == 50


def test_plan_refuses_a_bare_string() -> None:
    with pytest.raises(TypeError):
        plan_images("https://a.test/1.png")


# --- worker-path selection checks (docs/pd-contract.md §5) ---------------------------------


def test_scheme_intersection_ignores_legs_advertising_none() -> None:
    assert accepted_media_ref_schemes([None, set()]) is None
    assert accepted_media_ref_schemes([{"http", "https", "data"}, None]) == {
        "http",
        "https",
        "data",
    }
    assert accepted_media_ref_schemes([{"HTTP", "https", "data"}, {"https", "file"}]) == {"https"}


def test_scheme_check_refuses_outside_the_intersection() -> None:
    legs = [parse_scheme_label("http,https,data"), parse_scheme_label("https, data")]
    check_media_ref_schemes(["HTTPS://media.test/a.png", "data:image/png;base64,AAAA"], legs)
    with pytest.raises(TandemError) as info:
        check_media_ref_schemes(["https://media.test/a.png", "http://media.test/b.png"], legs)
    assert (info.value.code, info.value.status) == ("media_ref_scheme_not_accepted", 400)
    assert "image 1" in info.value.message and "'http'" in info.value.message


def test_scheme_check_passes_when_no_leg_advertises() -> None:
    check_media_ref_schemes(["ftp://media.test/a.png"], [None, None])


def test_scheme_check_refuses_a_url_without_scheme() -> None:
    with pytest.raises(TandemError) as info:
        check_media_ref_schemes(["/relative/a.png"], [{"https"}])
    assert info.value.code == "media_ref_scheme_not_accepted"


def test_parse_scheme_label() -> None:
    assert parse_scheme_label(None) is None
    assert parse_scheme_label("") is None
    assert parse_scheme_label(" , ") is None
    assert parse_scheme_label("HTTP,https,,data") == {"http", "https", "data"}


def test_candidate_filter_503_only_for_a_populated_pool_without_capable_workers() -> None:
    pool = [("p0", False), ("p1", True), ("p2", False)]
    assert filter_media_ref_capable(pool, lambda w: w[1], "prefill") == [("p1", True)]
    assert filter_media_ref_capable([], lambda w: True, "decode") == []
    with pytest.raises(TandemError) as info:
        filter_media_ref_capable([("d0", False)], lambda w: w[1], "decode")
    err = info.value
    assert (err.code, err.status, err.retryable) == ("no_media_ref_capable_worker", 503, False)
    assert "decode" in err.message


def test_selected_legs_must_all_accept_media_refs() -> None:
    check_legs_accept_media_refs([True, True])
    with pytest.raises(TandemError) as info:
        check_legs_accept_media_refs([True, False])
    assert (info.value.code, info.value.status) == ("multimodal_not_supported", 400)
