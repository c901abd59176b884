"""An MLX worker's info answers as labels: every model field by the common rules, a context
of 0 (MLX's servicer reports it for tiny-llava-1.5) as no label at all, the server's
runtime state left out, no vision ever, the Tandem marker kept; and the model id."""

from __future__ import annotations

from tandem.gateway.backends.mlx.labels import model_id_of, worker_labels
from tandem.gateway.workers.worker import Worker
from tandem.wire.mlx import mpb
from tandem.wire.worker_marker import TANDEM_WORKER_LABEL


def model_info(**fields: object) -> mpb.GetModelInfoResponse:
    base: dict[str, object] = {
        "model_path": "/ckpt/tiny-llava-1.5",
        "served_model_name": "/ckpt/tiny-llava-1.5",
        "is_generation": True,
        "model_type": "llava",
        "architectures": ["LlavaForConditionalGeneration"],
        "eos_token_ids": [2],
        "bos_token_id": 1,
    }
    return mpb.GetModelInfoResponse(**{**base, **fields})


SERVER = mpb.GetServerInfoResponse(server_type="mlx-grpc", active_requests=3, uptime_seconds=9.5)


def test_a_real_servicers_answers() -> None:
    labels = worker_labels(model_info(), SERVER)
    assert labels == {
        "model_path": "/ckpt/tiny-llava-1.5",
        "served_model_name": "/ckpt/tiny-llava-1.5",
        "is_generation": "true",
        "model_type": "llava",
        "architectures": '["LlavaForConditionalGeneration"]',
        "eos_token_ids": "[2]",
        "bos_token_id": "1",
        "server_type": "mlx-grpc",
        "supports_vision": "false",
        "protocol": "mlx",
    }
    worker = Worker("127.0.0.1:1", "regular", labels, model_id_of(model_info()))
    assert worker.language_model_only and not worker.enforces_tandem_media_policy
    assert worker.model_id == "/ckpt/tiny-llava-1.5"


def test_a_known_context_and_the_tandem_marker() -> None:
    labels = worker_labels(
        model_info(max_context_length=2048, max_req_input_len=2047, vocab_size=512),
        mpb.GetServerInfoResponse(server_type="tandem-mlx-grpc"),
        "0.9.0",
    )
    assert labels["max_context_length"] == "2048" and labels["max_req_input_len"] == "2047"
    assert labels["vocab_size"] == "512" and labels[TANDEM_WORKER_LABEL] == "0.9.0"
    assert labels["server_type"] == "tandem-mlx-grpc"


def test_the_model_id() -> None:
    assert model_id_of(model_info(served_model_name="tiny")) == "tiny"
    assert model_id_of(model_info(served_model_name="")) == "tiny-llava-1.5"
    assert model_id_of(mpb.GetModelInfoResponse()) == ""
