"""How ``--processes N`` shares one gateway's limits out among its children
(gateway/multiprocess/shared_limits.py), and what it refuses at start-up."""

from __future__ import annotations

import pytest

from tandem.gateway.config import GatewayConfig
from tandem.gateway.multiprocess.shared_limits import check_shares, child_config, share


@pytest.mark.parametrize("total", [0, 1, 2, 5, 7, 256, 513])
@pytest.mark.parametrize("processes", [1, 2, 3, 4])
def test_shares_add_up_to_the_total(total: int, processes: int) -> None:
    parts = [share(total, i, processes) for i in range(processes)]
    assert sum(parts) == total
    assert max(parts) - min(parts) <= 1  # as even as integers allow


def test_a_bound_that_is_off_stays_off_and_an_on_bound_never_becomes_zero() -> None:
    assert [share(0, i, 3, at_least_one=True) for i in range(3)] == [0, 0, 0]
    assert [share(2, i, 3, at_least_one=True) for i in range(3)] == [1, 1, 1]


def test_child_configs_split_every_limit() -> None:
    config = GatewayConfig(
        worker_urls=["127.0.0.1:9"],
        processes=3,
        max_concurrent_requests=10,
        max_queued_requests=5,
        mm_max_inflight_bytes=1000,
        mm_pixel_cache_mb=256,
        mm_workers=4,
    )
    children = [child_config(config, i, 8123) for i in range(3)]
    assert [c.port for c in children] == [8123] * 3
    assert [c.processes for c in children] == [3] * 3  # each knows it is one of three
    assert [c.max_concurrent_requests for c in children] == [4, 3, 3]
    assert [c.max_queued_requests for c in children] == [2, 2, 1]
    assert [c.mm_max_inflight_bytes for c in children] == [334, 333, 333]
    assert [c.mm_pixel_cache_mb for c in children] == [86, 85, 85]
    assert [c.mm_workers for c in children] == [2, 1, 1]
    assert children[0].worker_urls == config.worker_urls


def test_a_concurrency_limit_below_the_process_count_is_refused() -> None:
    config = GatewayConfig(worker_urls=["127.0.0.1:9"], processes=4, max_concurrent_requests=3)
    with pytest.raises(ValueError, match="--max-concurrent-requests=3"):
        check_shares(config)
    check_shares(GatewayConfig(worker_urls=["127.0.0.1:9"], processes=4))  # 256: fine
    # 0 is "no bound", not "no slot".
    check_shares(GatewayConfig(worker_urls=["127.0.0.1:9"], processes=4, max_concurrent_requests=0))


def test_memory_history_is_refused_with_several_processes() -> None:
    with pytest.raises(ValueError, match="--history-backend memory"):
        GatewayConfig(worker_urls=["127.0.0.1:9"], processes=2, history_backend="memory")
    with pytest.raises(ValueError, match="--processes must be >= 1"):
        GatewayConfig(worker_urls=["127.0.0.1:9"], processes=0)
