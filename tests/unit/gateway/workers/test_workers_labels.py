"""Label flattening on real proto messages (docs/pd-contract.md §2) and Worker's label checks."""

from __future__ import annotations

import json

from tandem.gateway.backends.vllm.labels import (
    model_id_of,
    model_labels,
    server_labels,
    worker_labels,
)
from tandem.gateway.workers.worker import Worker
from tandem.wire.proto import pb


def test_model_info_bools_kept_empties_skipped_arrays_json() -> None:
    info = pb.GetModelInfoResponse(
        model_path="/m/tiny",
        is_generation=True,
        supports_vision=False,
        vocab_size=512,
        max_context_length=0,
        served_model_name="",
        architectures=["A", "B"],
        eos_token_ids=[2, 7],
        pad_token_id=-1,
    )
    labels = model_labels(info)
    assert labels["supports_vision"] == "false"  # a false bool is kept: LMO must be visible
    assert labels["is_generation"] == "true"
    assert labels["vocab_size"] == "512"
    assert labels["pad_token_id"] == "-1"  # negative is not zero
    assert json.loads(labels["architectures"]) == ["A", "B"]
    assert labels["eos_token_ids"] == "[2,7]"
    for absent in ("max_context_length", "served_model_name", "tokenizer_path", "bos_token_id"):
        assert absent not in labels


def test_server_info_skips_runtime_state_and_empty_fields() -> None:
    info = pb.GetServerInfoResponse(
        active_requests=4,
        is_paused=False,
        uptime_seconds=12.5,
        server_type="vllm-grpc",
        kv_connector="",
        mm_processor="inprocess",
        mm_media_ref_schemes="http,https,data,file",
        mm_device_do_normalize=True,
        data_parallel_size=1,
        block_size=0,
    )
    labels = server_labels(info)
    assert labels == {
        "server_type": "vllm-grpc",
        "data_parallel_size": "1",
        "mm_processor": "inprocess",
        "mm_media_ref_schemes": "http,https,data,file",
        "mm_device_do_normalize": "true",
    }  # runtime state (active_requests, is_paused, uptime) and empties/zeros are absent
    # Booleans on GetServerInfo are kept as well, false included.
    assert server_labels(pb.GetServerInfoResponse())["mm_device_do_normalize"] == "false"


def test_worker_labels_merge_and_model_id() -> None:
    model = pb.GetModelInfoResponse(model_path="/models/llava/", supports_vision=True)
    server = pb.GetServerInfoResponse(kv_connector="NixlConnector")
    labels = worker_labels(model, server)
    assert labels["supports_vision"] == "true" and labels["kv_connector"] == "NixlConnector"
    assert model_id_of(model) == "llava"
    model.served_model_name = "served"
    assert model_id_of(model) == "served"
    assert model_id_of(pb.GetModelInfoResponse()) == ""


def make_worker(labels: dict[str, str]) -> Worker:
    return Worker(url="127.0.0.1:9", role="decode", labels=labels, model_id="m")


def test_worker_capabilities_from_labels() -> None:
    absent = make_worker({})
    assert absent.supports_vision and not absent.language_model_only  # absent = capable
    assert not absent.accepts_media_refs and absent.media_ref_schemes == frozenset()
    assert absent.kv_connector == ""

    lmo = make_worker({"supports_vision": "false"})
    assert lmo.language_model_only and not lmo.supports_vision

    full = make_worker(
        {
            "supports_vision": "true",
            "mm_processor": "inprocess",
            "mm_media_ref_schemes": "http, HTTPS,data,",
            "kv_connector": "TandemConnector",
        }
    )
    assert full.supports_vision and not full.language_model_only
    assert full.accepts_media_refs
    assert full.media_ref_schemes == {"http", "https", "data"}
    assert full.kv_connector == "TandemConnector"


def test_worker_available_needs_health_and_breaker() -> None:
    worker = make_worker({})
    assert worker.available
    worker.healthy = False
    assert not worker.available
    worker.healthy = True
    for _ in range(worker.breaker.failure_threshold):
        worker.breaker.record_failure()
    assert not worker.available
