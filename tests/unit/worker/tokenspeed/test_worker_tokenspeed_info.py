"""What a TokenSpeed worker says about itself, and the flags that make one.

Model info, ``server_args`` (the keys smg reads), loads, the health answer per role; the
``--protocol tokenspeed`` and ``--role encode`` flags and the adapter they name.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tandem.cli import build_parser
from tandem.models.info import load_model_info
from tandem.wire.tokenspeed import IMAGE
from tandem.worker.adapters import adapter_for
from tandem.worker.cli import config_from_args
from tandem.worker.config import WorkerConfig
from tandem.worker.tokenspeed import info

SMG_KEYS = {
    "model",
    "model_path",
    "served_model_name",
    "tokenizer",
    "tokenizer_path",
    "tp_size",
    "dp_size",
    "pp_size",
    "context_length",
    "max_total_tokens",
    "max_running_requests",
    "is_embedding",
    "vocab_size",
    "disaggregation_mode",
    "disaggregation_bootstrap_port",
    "page_size",
}


def worker_config(*flags: str) -> WorkerConfig:
    return config_from_args(build_parser().parse_args(["worker", *flags]))


def test_model_info_states_every_field_that_applies(qwen_meta_dir: Path) -> None:
    model = load_model_info(qwen_meta_dir)
    got = info.model_info(WorkerConfig(protocol="tokenspeed"), model)
    assert got.model_path == got.tokenizer_path == str(model.model_dir)
    assert got.served_model_name == "tiny-qwen3-vl" and got.model_type == model.model_type
    assert list(got.architectures) and got.vocab_size == model.vocab_size
    assert (got.max_context_length, got.max_req_input_len) == (
        model.max_context,
        model.max_context - 1,
    )
    assert list(got.eos_token_ids) == list(model.eos_token_ids)
    assert got.supports_vision and got.supports_multimodal
    assert list(got.supported_modalities) == [IMAGE]
    assert (got.model_dtype, got.multimodal_encoder_dtype) == ("float32", "float32")
    assert got.default_sampling_params_json in ("", "{}")
    lmo = info.model_info(WorkerConfig(protocol="tokenspeed", language_model_only=True), model)
    assert not lmo.supports_vision and not lmo.supports_multimodal
    assert list(lmo.supported_modalities) == []


@pytest.mark.parametrize(
    ("role", "mode"),
    [("both", "null"), ("prefill", "prefill"), ("decode", "decode"), ("encode", "encode")],
)
def test_server_info_names_the_role_and_the_bootstrap_port(
    qwen_meta_dir: Path, role: str, mode: str
) -> None:
    model = load_model_info(qwen_meta_dir)
    config = WorkerConfig(protocol="tokenspeed", role=role)  # type: ignore[arg-type]
    got = info.server_info(config, model, 8123, started=0.0, active=2)
    args = dict(got.server_args.items())
    assert set(args) >= SMG_KEYS
    assert args["disaggregation_mode"] == mode
    assert int(args["disaggregation_bootstrap_port"]) == 8123
    assert int(args["tp_size"]) == int(args["dp_size"]) == 1 and args["is_embedding"] is False
    assert int(args["context_length"]) == model.max_context
    assert got.tokenspeed_version.startswith("tandem-") and got.constrained_decoding == "requested"
    assert got.active_requests == 2 and got.uptime_seconds > 0 and got.start_time.seconds > 0
    assert "shm_namespace_id" not in dict(got.scheduler_info.items()), "inline tensors only"


def test_loads_have_one_rank_and_none_on_an_encode_worker() -> None:
    got = info.loads(WorkerConfig(protocol="tokenspeed"), running=2, waiting=1)
    assert got.dp_rank_count == 1 and len(got.loads) == 1
    load = got.loads[0]
    assert (load.dp_rank, load.num_running_reqs, load.num_waiting_reqs, load.num_total_reqs) == (
        0,
        2,
        1,
        3,
    )
    encode = WorkerConfig(protocol="tokenspeed", role="encode")
    assert list(info.loads(encode, running=0, waiting=0).loads) == []


def test_disaggregated_workers_answer_health_shallowly() -> None:
    for role in ("prefill", "decode", "encode"):
        config = WorkerConfig(protocol="tokenspeed", role=role)  # type: ignore[arg-type]
        got = info.health(config, alive=False)
        assert got.healthy and got.message == info.SHALLOW_HEALTH
    aggregated = WorkerConfig(protocol="tokenspeed")
    assert info.health(aggregated, alive=True).healthy
    assert not info.health(aggregated, alive=False).healthy


def test_the_tokenspeed_flags() -> None:
    config = worker_config("--protocol", "tokenspeed", "--disaggregation-bootstrap-port", "8998")
    assert (config.protocol, config.bootstrap_port) == ("tokenspeed", 8998)
    assert worker_config("--protocol", "tokenspeed", "--role", "encode").role == "encode"
    adapter = adapter_for("tokenspeed")
    assert adapter.server_info_method == (
        "/tokenspeed.grpc.scheduler.TokenSpeedScheduler/GetServerInfo"
    )
    assert callable(adapter.serve)


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--role", "encode"], "needs --protocol tokenspeed"),
        (["--protocol", "sglang", "--role", "encode"], "needs --protocol tokenspeed"),
        (["--protocol", "tokenspeed", "--role", "encode", "--engine", "null"], "--engine embed"),
        (
            ["--protocol", "tokenspeed", "--role", "encode", "--language-model-only"],
            "--language-model-only",
        ),
        (["--disaggregation-bootstrap-port", "8998"], "sglang or --protocol tokenspeed"),
        (["--protocol", "tokenspeed", "--disaggregation-bootstrap-port", "0"], "1..65535"),
    ],
)
def test_bad_combinations_are_refused(flags: list[str], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        worker_config(*flags)
