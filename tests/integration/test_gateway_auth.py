"""Access control on a real gateway over real workers (docs/operations.md, "Access control").

- ``--api-key`` / ``--tenant-api-key`` guard ``/v1/*``: the official openai client gets
  ``AuthenticationError`` (``invalid_api_key``) without a key and answers with one;
- ``--control-plane-api-keys``: a ``user`` key lists workers, only an ``admin`` key adds
  and removes them;
- a gateway listening beyond loopback without control-plane keys refuses ``/workers`` to
  everyone and says so once at start-up (it binds the wildcard ``0.0.0.0`` and is called
  on 127.0.0.1: no address but loopback is ever dialled);
- registration failures answer with a code and no gRPC details; a worker whose model files
  the gateway cannot load gives 503 ``model_files_unavailable`` on ``/v1/models`` and on
  registration, never a 500. The unloadable files are real: a checkpoint copy whose chat
  template does not compile (the worker never renders chat, the gateway must).
"""

from __future__ import annotations

import json
import shutil
import socket
import time
from pathlib import Path

import httpx
import openai
import pytest

from tandem.engine.builtin import resolve_model

from .processes import SINGLE_PROCESS, Proc, start_all

MODEL = "tiny-qwen3-vl"
API_KEY = "sk-plain-test-key"
TENANT_KEY = "sk-acme-test-key"
ADMIN_KEY = "sk-admin-test-key"
USER_KEY = "sk-user-test-key"


@pytest.fixture(scope="module")
def broken_model(model_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("broken") / MODEL
    shutil.copytree(resolve_model(MODEL), target)
    config_file = target / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["chat_template"] = "{% if %}"  # does not compile
    config_file.write_text(json.dumps(config))
    (target / "chat_template.jinja").unlink(missing_ok=True)
    return target


@pytest.fixture(scope="module")
def stack(model_cache: Path, broken_model: Path):
    good, broken = start_all(
        [
            ["worker", "--model", MODEL],
            ["worker", "--model", str(broken_model), "--served-model-name", MODEL],
        ]
    )
    # single_process: these tests add and remove workers through the admin API and count
    # the gateway's own start-up warnings (one per process under --processes N)
    keyed, exposed, empty = start_all(
        [
            [
                "gateway", "--port", "0", "--worker-urls", good.address, *SINGLE_PROCESS,
                "--api-key", API_KEY, "--tenant-api-key", f"acme:{TENANT_KEY}",
                "--control-plane-api-keys", f"ops:Operators:admin:{ADMIN_KEY}",
                f"dash:Dashboards:user:{USER_KEY}",
            ],
            ["gateway", "--host", "0.0.0.0", "--port", "0", "--worker-urls", broken.address,
             *SINGLE_PROCESS],
            ["gateway", "--port", "0", *SINGLE_PROCESS],
        ]
    )  # fmt: skip
    yield {"good": good, "broken": broken, "keyed": keyed, "exposed": exposed, "empty": empty}
    for proc in (keyed, exposed, empty, good, broken):
        proc.stop()


def base(proc: Proc) -> str:
    # A wildcard bind is announced as 0.0.0.0; it is reached on loopback.
    return proc.address.replace("0.0.0.0", "127.0.0.1")


def api(proc: Proc, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base(proc)}/v1", api_key=key, max_retries=0)


def ask(proc: Proc, key: str):
    return api(proc, key).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # closed on exit: nothing listens there


def test_api_keys_and_tenant_keys(stack) -> None:
    keyed = stack["keyed"]
    for key in ("wrong-key", ADMIN_KEY):  # a control-plane key does not open /v1
        with pytest.raises(openai.AuthenticationError) as info:
            ask(keyed, key)
        assert info.value.code == "invalid_api_key"
        with pytest.raises(openai.AuthenticationError):
            api(keyed, key).models.list()
    assert ask(keyed, API_KEY).usage.completion_tokens == 2
    assert [m.id for m in api(keyed, API_KEY).models.list()] == [MODEL]
    assert ask(keyed, TENANT_KEY).usage.completion_tokens == 2
    # The log line is read from the gateway's output by a background thread: wait for it.
    deadline = time.monotonic() + 10
    while not (tenant_lines := [ln for ln in list(keyed.lines) if " tenant=acme " in ln]):
        assert time.monotonic() < deadline, "no access-log line names the tenant"
        time.sleep(0.02)
    assert len(tenant_lines) == 1 and "tandem.gateway.access" in tenant_lines[0]
    # Open without a key.
    assert httpx.get(f"{keyed.address}/health").status_code == 200
    assert "tandem_requests_total" in httpx.get(f"{keyed.address}/metrics").text
    assert httpx.get(f"{keyed.address}/openapi.json").status_code == 200


def test_control_plane_roles(stack) -> None:
    workers = f"{stack['keyed'].address}/workers"
    url = stack["good"].address
    for headers in ({}, bearer("wrong-key"), bearer(API_KEY)):
        refused = httpx.get(workers, headers=headers)
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    listed = httpx.get(workers, headers=bearer(USER_KEY))
    assert listed.status_code == 200 and [w["url"] for w in listed.json()["workers"]] == [url]
    for response in (
        httpx.delete(workers, params={"url": url}, headers=bearer(USER_KEY)),
        httpx.post(workers, json={"url": url}, headers=bearer(USER_KEY)),
    ):
        assert response.status_code == 403
        assert response.json()["error"]["code"] == "permission_denied"
    assert httpx.delete(workers, params={"url": url}, headers=bearer(ADMIN_KEY)).status_code == 200
    added = httpx.post(workers, json={"url": url}, headers=bearer(ADMIN_KEY), timeout=30)
    assert added.status_code == 201, added.text
    assert ask(stack["keyed"], API_KEY).choices[0].message.content is not None


def test_non_loopback_bind_without_keys_shuts_the_admin_api(stack) -> None:
    exposed = stack["exposed"]
    assert exposed.address.startswith("http://0.0.0.0:")
    for response in (
        httpx.get(f"{base(exposed)}/workers"),
        httpx.post(f"{base(exposed)}/workers", json={"url": stack["good"].address}),
        httpx.delete(f"{base(exposed)}/workers", params={"url": stack["broken"].address}),
    ):
        assert response.status_code == 403, response.text
        assert response.json()["error"]["code"] == "admin_api_disabled"
    warnings = [line for line in list(exposed.lines) if "WARNING" in line and "/workers" in line]
    assert len(warnings) == 1, exposed.output()[-2000:]
    assert httpx.get(f"{base(exposed)}/metrics").status_code == 200


def test_unloadable_model_files_are_503_not_500(stack) -> None:
    exposed = stack["exposed"]  # started over the worker whose chat template is broken
    with pytest.raises(openai.InternalServerError) as info:
        api(exposed, "unused").models.list()
    assert info.value.status_code == 503 and info.value.code == "model_files_unavailable"
    with pytest.raises(openai.InternalServerError) as info:
        ask(exposed, "unused")
    assert info.value.status_code == 503 and info.value.code == "model_files_unavailable"
    assert "could not load the model files" in exposed.output()

    empty = f"{stack['empty'].address}/workers"
    failed = httpx.post(empty, json={"url": stack["broken"].address}, timeout=60)
    assert failed.status_code == 503, failed.text
    assert failed.json()["error"]["code"] == "model_files_unavailable"
    assert httpx.get(empty).json()["workers"] == []  # the registration was undone


def test_registration_errors_are_coded_without_grpc_details(stack) -> None:
    empty = stack["empty"]
    workers = f"{empty.address}/workers"
    url = f"127.0.0.1:{closed_port()}"
    failed = httpx.post(workers, json={"url": url}, timeout=60)
    assert failed.status_code == 502, failed.text
    error = failed.json()["error"]
    assert error["code"] == "worker_unreachable" and error["param"] == "url"
    for detail in ("UNAVAILABLE", "DEADLINE", "refused", "connect", "ipv4", "tcp"):
        assert detail.lower() not in error["message"].lower(), error["message"]
    assert f"registering worker {url} failed" in empty.output()  # the reason is logged
    for content, status in ((b"[1, 2]", 400), (b'"text"', 400), (b"{" + b" " * 8000 + b"}", 413)):
        answer = httpx.post(workers, content=content)
        assert answer.status_code == status, answer.text
    assert httpx.get(workers).json()["workers"] == []
