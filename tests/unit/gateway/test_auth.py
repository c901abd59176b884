"""Key parsing and the access decisions of gateway/auth.py, as pure functions."""

from __future__ import annotations

import hmac

import pytest

from tandem.errors import TandemError
from tandem.gateway import auth
from tandem.gateway.auth import (
    AccessPolicy,
    ControlPlaneKey,
    ServingKey,
    bearer_token,
    check_admin,
    check_distinct,
    check_serving,
    find_key,
    is_admin_path,
    is_loopback_address,
    is_loopback_bind,
    is_serving_path,
    parse_control_plane_key,
    parse_tenant_key,
)

SECRET = "sk-very-secret"


def test_tenant_key_splits_at_the_first_colon() -> None:
    key = parse_tenant_key("acme:sk:with:colons")
    assert key.tenant == "acme" and key.key == "sk:with:colons"


@pytest.mark.parametrize("spec", ["acme", ":" + SECRET, "acme:", ""])
def test_bad_tenant_keys_are_refused_without_echoing_them(spec: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_tenant_key(spec)
    assert SECRET not in str(info.value)


def test_control_plane_key_format() -> None:
    key = parse_control_plane_key("ops1:Ops team:admin:sk:a:b")
    assert (key.id, key.name, key.role, key.key) == ("ops1", "Ops team", "admin", "sk:a:b")
    assert key.may_write
    assert not parse_control_plane_key("ro:Dashboards:user:k").may_write


@pytest.mark.parametrize(
    "spec", [f"id:name:root:{SECRET}", f"id:name:{SECRET}", f"id::admin:{SECRET}", "a:b:user:"]
)
def test_bad_control_plane_keys_are_refused_without_echoing_them(spec: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_control_plane_key(spec)
    assert SECRET not in str(info.value)


def test_keys_never_show_in_a_repr() -> None:
    assert SECRET not in repr(ServingKey(SECRET, "acme"))
    assert SECRET not in repr(ControlPlaneKey("i", "n", "admin", SECRET))


def test_the_same_key_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="twice"):
        check_distinct([ServingKey("k"), ServingKey("k", "acme")], "--api-key")
    check_distinct([ServingKey("k"), ServingKey("l", "acme")], "--api-key")


@pytest.mark.parametrize(
    ("header", "token"),
    [
        ("Bearer abc", "abc"),
        ("bearer   abc ", "abc"),
        ("Basic abc", None),
        ("Bearer", None),
        ("Bearer ", None),
        ("", None),
        (None, None),
    ],
)
def test_bearer_token(header: str | None, token: str | None) -> None:
    assert bearer_token(header) == token


def test_find_key_compares_every_key_even_after_a_match(monkeypatch: pytest.MonkeyPatch) -> None:
    keys = [ServingKey("first"), ServingKey("second", "acme"), ServingKey("third")]
    calls: list[int] = []
    real = hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        calls.append(len(b))
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", counting)
    assert find_key("first", keys) is keys[0]
    assert find_key("second", keys) is keys[1]
    assert find_key("nope", keys) is None
    assert find_key("fir", keys) is None  # a prefix is not the key
    # Three comparisons per lookup, each of two 32-byte digests: no early exit, and the
    # key's length never decides how long a comparison takes.
    assert calls == [32] * 12
    assert find_key(None, keys) is None


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("[::1]", True),
        ("::ffff:127.0.0.1", True),
        ("0.0.0.0", False),
        ("::", False),
        ("", False),
        (None, False),
        ("localhost", False),  # a peer is an address; a name proves nothing
        ("testclient", False),
        ("peer.example.test", False),
    ],
)
def test_loopback_peer(host: str | None, loopback: bool) -> None:
    assert is_loopback_address(host) is loopback


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.0.2", True),
        ("::1", True),
        ("localhost", True),
        ("LocalHost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("", False),
        ("gateway.example.test", False),  # a name may resolve to anything
    ],
)
def test_loopback_bind(host: str, loopback: bool) -> None:
    assert is_loopback_bind(host) is loopback


def test_paths() -> None:
    assert is_serving_path("/v1/chat/completions") and is_serving_path("/v1")
    assert not is_serving_path("/v10/models") and not is_serving_path("/health")
    assert is_admin_path("/workers") and is_admin_path("/workers/")
    assert not is_admin_path("/workersx") and not is_admin_path("/metrics")


def _code(call) -> tuple[int, str]:
    with pytest.raises(TandemError) as info:
        call()
    return info.value.status, info.value.code


def test_serving_routes_open_without_keys_and_closed_with() -> None:
    assert check_serving(AccessPolicy(), None) is None
    policy = AccessPolicy(serving_keys=(ServingKey("plain"), ServingKey("t-key", "acme")))
    assert _code(lambda: check_serving(policy, None)) == (401, "invalid_api_key")
    assert _code(lambda: check_serving(policy, "Bearer wrong")) == (401, "invalid_api_key")
    plain = check_serving(policy, "Bearer plain")
    assert plain is not None and plain.tenant is None
    tenant = check_serving(policy, "Bearer t-key")
    assert tenant is not None and tenant.tenant == "acme"


def test_control_plane_roles() -> None:
    policy = AccessPolicy(
        control_plane_keys=(
            ControlPlaneKey("a1", "ops", "admin", "admin-key"),
            ControlPlaneKey("u1", "dash", "user", "user-key"),
        ),
        loopback_bind=False,  # keys make the admin API usable wherever the gateway listens
    )
    for method in ("GET", "POST", "DELETE"):
        assert _code(lambda m=method: check_admin(policy, None, m, "::1")) == (
            401,
            "invalid_api_key",
        )
        admin = check_admin(policy, "Bearer admin-key", method, None)
        assert admin is not None and admin.id == "a1"
    user = check_admin(policy, "Bearer user-key", "GET", None)
    assert user is not None and user.id == "u1"
    for method in ("POST", "DELETE", "PUT"):
        assert _code(lambda m=method: check_admin(policy, "Bearer user-key", m, None)) == (
            403,
            "permission_denied",
        )
    # A serving key is not a control-plane key.
    assert _code(lambda: check_admin(policy, "Bearer plain", "GET", None))[0] == 401


def test_no_control_plane_key_means_loopback_only() -> None:
    local = AccessPolicy(loopback_bind=True)
    assert local.startup_warning() is None
    assert check_admin(local, None, "POST", "127.0.0.1") is None
    assert check_admin(local, None, "DELETE", "::1") is None
    for peer in ("peer.example.test", None, "0.0.0.0"):
        assert _code(lambda p=peer: check_admin(local, None, "GET", p)) == (
            403,
            "admin_api_disabled",
        )


def test_no_control_plane_key_on_a_non_loopback_bind_refuses_everyone() -> None:
    exposed = AccessPolicy(loopback_bind=is_loopback_bind("0.0.0.0"))
    warning = exposed.startup_warning()
    assert warning and "--control-plane-api-keys" in warning
    for method in ("GET", "POST"):
        assert _code(lambda m=method: check_admin(exposed, None, m, "127.0.0.1")) == (
            403,
            "admin_api_disabled",
        )
