"""The history flags → GatewayConfig, their checks, the store's lifecycle in the gateway.

The last test starts a real `tandem gateway` process against a refused PostgreSQL port.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tandem.cli import build_parser
from tandem.gateway.cli import config_from_args
from tandem.gateway.config import GatewayConfig
from tandem.gateway.history.factory import open_store
from tandem.gateway.history.memory import MemoryStore
from tandem.gateway.history.pgurl import redacted, scrubbed
from tandem.gateway.history.postgres import PostgresStore
from tandem.gateway.history.settings import HISTORY_DIR_ENV, default_sqlite_path
from tandem.gateway.history.sqlite import SqliteStore
from tandem.gateway.history.store import NO_TENANT, HistoryLimits, StoredResponse
from tandem.gateway.state import GatewayState

MiB = 1 << 20
SECRET_URL = "postgresql://app:pa%40ss-w0rd@127.0.0.1:5432/history"


def gateway_config(*argv: str) -> GatewayConfig:
    return config_from_args(build_parser().parse_args(["gateway", *argv]))


def refused_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_defaults_keep_conversations_in_sqlite_under_the_history_dir(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = gateway_config()
    assert config.history_backend == "sqlite"
    assert config.history_sqlite_path is None and config.postgres_db_url is None
    assert config.history == HistoryLimits()
    monkeypatch.setenv(HISTORY_DIR_ENV, str(tmp_path))
    store = open_store(config)
    assert isinstance(store, SqliteStore) and store.path == tmp_path / "responses.sqlite3"
    monkeypatch.delenv(HISTORY_DIR_ENV)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_sqlite_path() == tmp_path / "home/.cache/tandem/history/responses.sqlite3"


def test_flags_convert_to_the_config() -> None:
    config = gateway_config(
        "--history-ttl-secs", "0",
        "--history-max-mb", "2.5",
        "--history-max-response-mb", "0.5",
        "--history-max-turns", "7",
        "--history-sqlite-path", "/tmp/x.sqlite3",
    )  # fmt: skip
    assert config.history == HistoryLimits(
        ttl_s=None, max_total_bytes=round(2.5 * MiB), max_response_bytes=MiB // 2, max_turns=7
    )
    assert config.history_sqlite_path == Path("/tmp/x.sqlite3")
    assert gateway_config("--history-max-mb", "0").history.max_total_bytes == 0  # no cap
    assert gateway_config("--history-ttl-secs", "60").history.ttl_s == 60.0
    assert config.history.max_tenant_bytes is None  # the even share, resolved at open
    tenant = gateway_config("--history-tenant-max-mb", "40", "--history-max-response-mb", "4")
    assert tenant.history.max_tenant_bytes == 40 * MiB
    assert gateway_config("--history-tenant-max-mb", "0").history.max_tenant_bytes == 0


def store_tenant_cap(*argv: str) -> int | None:
    store = open_store(gateway_config("--history-backend", "memory", *argv))
    assert isinstance(store, MemoryStore)
    return store.limits.max_tenant_bytes


def test_by_default_each_tenant_the_keys_name_gets_an_even_share() -> None:
    keys = ["--tenant-api-key", "a:k1", "--tenant-api-key", "b:k2", "--tenant-api-key", "b:k3"]
    assert store_tenant_cap() == 1024 * MiB  # no keys: one tenant, the whole total
    assert store_tenant_cap("--api-key", "k0") == 1024 * MiB
    assert store_tenant_cap("--history-max-mb", "100", *keys) == 50 * MiB  # a and b
    # --api-key's requests are one more tenant (the keyless one).
    assert store_tenant_cap("--history-max-mb", "99", "--api-key", "k0", *keys) == 33 * MiB
    # Never under one response: 64 MiB / 4 tenants would refuse a 32 MiB response.
    many = [f"--tenant-api-key=t{i}:k{i}" for i in range(4)]
    assert store_tenant_cap("--history-max-mb", "64", *many) == 32 * MiB
    assert store_tenant_cap("--history-max-mb", "0", *keys) == 0  # no total, no share
    given = ["--history-tenant-max-mb", "40", "--history-max-response-mb", "4"]
    assert store_tenant_cap("--history-max-mb", "100", *keys, *given) == 40 * MiB


def test_backends_from_the_flags() -> None:
    assert open_store(gateway_config("--history-backend", "none")) is None
    assert isinstance(open_store(gateway_config("--history-backend", "memory")), MemoryStore)
    pg = gateway_config("--history-backend", "postgres", "--postgres-db-url", SECRET_URL)
    store = open_store(pg)
    assert isinstance(store, PostgresStore)
    assert "pa%40ss-w0rd" not in repr(store) and "pa@ss-w0rd" not in repr(store)
    # A config that is logged never shows the URL.
    assert "pa%40ss" not in repr(pg) and "postgres_db_url" not in repr(pg)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--history-backend", "postgres"], "needs --postgres-db-url"),
        (["--history-backend", "postgres", "--postgres-db-url", "mysql://x"], "postgresql://"),
        (["--postgres-db-url", SECRET_URL], "needs --history-backend postgres"),
        (["--history-backend", "memory", "--history-sqlite-path", "x"], "needs --history-backend"),
        (["--history-max-response-mb", "0"], "--history-max-response-mb must be positive"),
        (["--history-max-mb", "1", "--history-max-response-mb", "2"], "must not be over"),
        (
            ["--history-max-mb", "100", "--history-tenant-max-mb", "200"],
            "--history-tenant-max-mb must not be over --history-max-mb",
        ),
        (
            ["--history-tenant-max-mb", "16"],  # --history-max-response-mb is 32
            "--history-max-response-mb must not be over --history-tenant-max-mb",
        ),
    ],
)
def test_bad_combinations_name_the_flag(argv: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message) as caught:
        gateway_config(*argv)
    assert "pa%40ss" not in str(caught.value) and "pa@ss" not in str(caught.value)


@pytest.mark.parametrize(
    "argv",
    [
        ["--history-backend", "files"],
        ["--history-max-turns", "0"],
        ["--history-ttl-secs", "-1"],
        ["--history-max-mb", "lots"],
        ["--history-max-mb", "inf"],
        ["--history-tenant-max-mb", "lots"],
        ["--history-tenant-max-mb", "-1"],
        ["--history-tenant-max-mb", "nan"],
        ["--history-tenant-max-mb", "inf"],
        ["--history-tenant-max-mb", "1e300"],
    ],
)
def test_bad_values_are_refused_by_the_parser(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["gateway", *argv])


@pytest.mark.parametrize(
    ("value", "message"),
    [("-1", "must be at least 0, got -1"), ("inf", "must be a size under 8 EiB, got inf")],
)
def test_a_bad_tenant_cap_is_named_in_one_line(
    value: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["gateway", "--history-tenant-max-mb", value])
    err = capsys.readouterr().err
    assert f"argument --history-tenant-max-mb: {message}" in err and "Traceback" not in err


def test_config_checks_limits_it_was_built_with_directly() -> None:
    with pytest.raises(ValueError, match="--history-max-turns"):
        GatewayConfig(history=HistoryLimits(max_turns=0))
    with pytest.raises(ValueError, match="--history-ttl-secs"):
        GatewayConfig(history=HistoryLimits(ttl_s=0))
    with pytest.raises(ValueError, match="--history-tenant-max-mb must be >= 0"):
        GatewayConfig(history=HistoryLimits(max_tenant_bytes=-1))
    with pytest.raises(ValueError, match="--history-backend must be one of"):
        GatewayConfig(history_backend="files")  # type: ignore[arg-type]


def test_urls_are_redacted_and_passwords_scrubbed() -> None:
    assert redacted(SECRET_URL) == "postgresql://app:***@127.0.0.1:5432/history"
    assert redacted("postgresql://[::1]:5/db?password=x") == "postgresql://[::1]:5/db?***"
    assert redacted("postgres://host/db") == "postgres://host/db"
    text = f"could not connect to {SECRET_URL}: password pa@ss-w0rd refused"
    clean = scrubbed(text, SECRET_URL)
    assert "pa@ss-w0rd" not in clean and "pa%40ss-w0rd" not in clean
    assert "127.0.0.1:5432" in clean
    query_url = "postgresql://u@h/db?sslmode=require&password=qpw-123"
    assert "qpw-123" not in scrubbed(f"bad {query_url} qpw-123", query_url)


async def test_gateway_state_starts_and_stops_its_store(tmp_path: Path) -> None:
    path = tmp_path / "nested" / "dirs" / "responses.sqlite3"
    state = GatewayState(GatewayConfig(history_sqlite_path=path, health_interval_s=600))
    assert isinstance(state.history, SqliteStore)
    await state.start()
    try:
        assert path.exists() and oct(path.stat().st_mode & 0o777) == "0o600"
        now = time.time()
        item = StoredResponse("r1", NO_TENANT, None, now, "completed", "m", {"a": 1}, [])
        await state.history.put(item)
    finally:
        await state.stop()
    # A gateway restarted on the same file keeps the conversation.
    again = GatewayState(GatewayConfig(history_sqlite_path=path, health_interval_s=600))
    await again.start()
    try:
        assert again.history is not None
        stored = await again.history.get(NO_TENANT, "r1")
        assert stored is not None and stored.response == {"a": 1}
    finally:
        await again.stop()
    assert GatewayState(GatewayConfig(history_backend="none")).history is None


async def test_a_store_that_cannot_start_fails_the_gateway_in_one_line() -> None:
    url = f"postgresql://app:s3cret-pw@127.0.0.1:{refused_port()}/db"
    state = GatewayState(GatewayConfig(history_backend="postgres", postgres_db_url=url))
    with pytest.raises(SystemExit) as caught:
        await state.start()
    message = str(caught.value.code)
    assert message.startswith("tandem gateway: error: postgres postgresql://app:***@127.0.0.1:")
    assert "cannot connect" in message and "s3cret-pw" not in message and "\n" not in message


@pytest.mark.processes
def test_the_gateway_process_exits_with_one_line_when_postgres_is_down(
    tmp_path: Path,
) -> None:
    url = f"postgresql://app:s3cret-pw@127.0.0.1:{refused_port()}/db"
    argv = ["gateway", "--port", "0", "--history-backend", "postgres", "--postgres-db-url", url]
    done = subprocess.run(
        [sys.executable, "-m", "tandem.cli", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    lines = [line for line in done.stderr.splitlines() if "tandem gateway: error" in line]
    assert len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr and "s3cret-pw" not in done.stderr + done.stdout
    assert "TANDEM_GATEWAY_READY" not in done.stdout


def test_serve_passes_the_history_flags_to_its_gateway(tmp_path: Path) -> None:
    from tandem.serve.cli import _history_args
    from tandem.serve.launcher import Plan

    def gateway_argv(*argv: str) -> list[str]:
        args = build_parser().parse_args(["serve", *argv])
        plan = Plan(
            model="tiny-qwen3-vl",
            prefill=1,
            decode=1,
            aggregated=True,
            decode_language_model_only=False,
            mm_processing="auto",
            port=0,
            log_level="info",
            image=tmp_path / "x.png",
            history_args=_history_args(args),
        )
        worker = SimpleNamespace(address="127.0.0.1:50051", role="worker-0")
        return plan.gateway_args([worker])  # type: ignore[list-item]

    default = gateway_argv()
    assert default[default.index("--history-backend") + 1] == "sqlite"
    assert "--history-sqlite-path" not in default  # the gateway's default file: kept
    chosen = gateway_argv("--history-backend", "sqlite", "--history-sqlite-path", "rel.db")
    assert chosen[chosen.index("--history-sqlite-path") + 1] == str(Path("rel.db").absolute())
    gateway = build_parser().parse_args(gateway_argv("--history-backend", "memory"))
    assert config_from_args(gateway).history_backend == "memory"


def test_serve_refuses_bad_history_flags_before_starting_anything() -> None:
    from tandem.serve.cli import _check_args

    args = build_parser().parse_args(["serve", "--history-backend", "postgres"])
    with pytest.raises(SystemExit):
        _check_args(args)
