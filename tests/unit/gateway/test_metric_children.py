"""``metrics.child``: the child prometheus_client gives, remembered, and counted on /metrics."""

from __future__ import annotations

from prometheus_client import generate_latest

from tandem.gateway import metrics


def test_a_child_is_the_one_labels_gives_and_its_counts_are_exported() -> None:
    first = metrics.child(metrics.RETRIES, "test-route-children")
    assert first is metrics.child(metrics.RETRIES, "test-route-children")
    assert first is metrics.RETRIES.labels("test-route-children")
    before = first._value.get()
    metrics.child(metrics.RETRIES, "test-route-children").inc()
    metrics.RETRIES.labels("test-route-children").inc()
    assert first._value.get() == before + 2
    exported = generate_latest(metrics.REGISTRY).decode()
    assert f'tandem_retries_total{{route="test-route-children"}} {before + 2}' in exported
