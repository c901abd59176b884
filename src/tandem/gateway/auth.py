"""Who may call what: API keys for the serving routes, control-plane keys for the admin API.

Pure functions and small value objects; :mod:`tandem.gateway.http.access_control` applies them
to each HTTP request. The rules (docs/operations.md, "Access control"):

- ``/v1/*``, ``/tokenize`` and ``/detokenize`` need ``Authorization: Bearer KEY`` as soon
  as one ``--api-key`` or ``--tenant-api-key`` is set; a tenant key also names the tenant
  the request belongs to.
- ``/workers`` needs a ``--control-plane-api-keys`` key when any is set: role ``user``
  may list, ``admin`` may also add and remove. With none set, only loopback clients of a
  gateway bound to a loopback address may use it.
- Everything else (``/health``, ``/metrics``, ``/openapi.json``) stays open.

Keys are compared by their SHA-256 digests with :func:`hmac.compare_digest`, against every
configured key without stopping at a match, so neither the time taken nor its variation
says which key (or how much of one) was right.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, TypeVar

from tandem.errors import TandemError, make_error

ControlPlaneRole = Literal["admin", "user"]
CONTROL_PLANE_ROLES: tuple[ControlPlaneRole, ...] = ("admin", "user")
READ_METHODS = frozenset({"GET", "HEAD"})
ADMIN_PATH = "/workers"
SERVING_PREFIX = "/v1"
# The serving routes: /v1/*, and vLLM's /tokenize and /detokenize outside /v1 (they read
# prompts and images like the rest, so they need a key too).
SERVING_ROOTS = (SERVING_PREFIX, "/tokenize", "/detokenize")


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


@dataclass(frozen=True, slots=True)
class ServingKey:
    """A key for ``/v1/*``; ``tenant`` is set for a ``--tenant-api-key``."""

    key: str = field(repr=False)
    tenant: str | None = None
    digest: bytes = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.key:
            raise ValueError("an API key must not be empty")
        object.__setattr__(self, "digest", _digest(self.key))


@dataclass(frozen=True, slots=True)
class ControlPlaneKey:
    """One ``--control-plane-api-keys`` entry, ``id:name:role:key``."""

    id: str
    name: str
    role: ControlPlaneRole
    key: str = field(repr=False)
    digest: bytes = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.key:
            raise ValueError("a control-plane API key must not be empty")
        object.__setattr__(self, "digest", _digest(self.key))

    @property
    def may_write(self) -> bool:
        return self.role == "admin"


def parse_tenant_key(spec: str) -> ServingKey:
    """``TENANT:KEY``; the key may itself hold colons. Errors never repeat the key."""
    tenant, sep, key = spec.partition(":")
    if not sep or not tenant or not key:
        raise ValueError("--tenant-api-key takes TENANT:KEY, both parts non-empty")
    return ServingKey(key, tenant)


def parse_control_plane_key(spec: str) -> ControlPlaneKey:
    """``id:name:role:key`` (role ``admin`` or ``user``); the key may hold colons."""
    parts = spec.split(":", 3)
    if len(parts) != 4 or not all(parts):
        raise ValueError("--control-plane-api-keys takes id:name:role:key, no part empty")
    key_id, name, role, key = parts
    if role not in CONTROL_PLANE_ROLES:
        raise ValueError(
            f"--control-plane-api-keys {key_id}: role must be admin or user, not {role!r}"
        )
    return ControlPlaneKey(key_id, name, role, key)


def check_distinct(keys: Sequence[ServingKey | ControlPlaneKey], flag: str) -> None:
    """The same key twice would make the tenant (or role) it stands for ambiguous."""
    digests = [k.digest for k in keys]
    if len(set(digests)) != len(digests):
        raise ValueError(f"{flag}: the same key is given twice")


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer TOKEN`` header (scheme case-insensitive)."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token


K = TypeVar("K", ServingKey, ControlPlaneKey)


def find_key(presented: str | None, keys: Sequence[K]) -> K | None:
    """The configured key equal to ``presented``, in constant time over all keys.

    Every key is compared (no early exit on a match), and digests of equal length are
    compared, so the timing reveals neither which key matched nor a key's length.
    """
    if presented is None:
        return None
    wanted = _digest(presented)
    found: K | None = None
    for key in keys:
        if hmac.compare_digest(wanted, key.digest) and found is None:
            found = key
    return found


def is_loopback_address(host: str | None) -> bool:
    """True for a loopback IP literal (127.0.0.0/8, ``::1``, IPv4-mapped ``::ffff:127.x``)."""
    if not host:
        return False
    host = host.strip()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    host = host.split("%", 1)[0]  # an IPv6 zone id says nothing about the address
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def is_loopback_bind(host: str) -> bool:
    """True when ``--host`` listens on loopback only: a loopback literal or ``localhost``.

    Wildcards (``0.0.0.0``, ``::``, empty) and every other name count as reachable from
    elsewhere: a name may resolve to anything, so it is not trusted to be local.
    """
    return host.strip().lower() == "localhost" or is_loopback_address(host)


@dataclass(frozen=True, slots=True)
class AccessPolicy:
    """The keys of both planes and where the gateway listens."""

    serving_keys: tuple[ServingKey, ...] = ()
    control_plane_keys: tuple[ControlPlaneKey, ...] = ()
    loopback_bind: bool = True

    @property
    def admin_disabled(self) -> bool:
        """No control-plane key and listening beyond loopback: nobody may use /workers."""
        return not self.control_plane_keys and not self.loopback_bind

    def startup_warning(self) -> str | None:
        if self.admin_disabled:
            return (
                "the worker admin API (/workers) is disabled: the gateway listens on a "
                "non-loopback address and no --control-plane-api-keys is set"
            )
        return None


def is_serving_path(path: str) -> bool:
    return any(path == root or path.startswith(root + "/") for root in SERVING_ROOTS)


def is_admin_path(path: str) -> bool:
    return path == ADMIN_PATH or path.startswith(ADMIN_PATH + "/")


def check_serving(policy: AccessPolicy, authorization: str | None) -> ServingKey | None:
    """The key a ``/v1/*`` request used (None when no key is configured), else 401."""
    if not policy.serving_keys:
        return None
    found = find_key(bearer_token(authorization), policy.serving_keys)
    if found is None:
        raise _unauthorized("missing or wrong API key (send 'Authorization: Bearer KEY')")
    return found


def check_admin(
    policy: AccessPolicy, authorization: str | None, method: str, peer: str | None
) -> ControlPlaneKey | None:
    """The control-plane key a ``/workers`` request used (None: keyless loopback access).

    Raises 401 ``invalid_api_key``, 403 ``permission_denied`` (a ``user`` key on a write)
    or 403 ``admin_api_disabled`` (no key configured and not a loopback-only gateway and
    client).
    """
    if policy.control_plane_keys:
        found = find_key(bearer_token(authorization), policy.control_plane_keys)
        if found is None:
            raise _unauthorized("missing or wrong control-plane API key")
        if method.upper() not in READ_METHODS and not found.may_write:
            raise make_error(
                "permission_denied", f"control-plane key {found.id!r} has role user: list only"
            )
        return found
    if policy.admin_disabled:
        raise make_error(
            "admin_api_disabled",
            "the admin API is disabled: set --control-plane-api-keys to use it on a gateway "
            "that listens beyond loopback",
        )
    if not is_loopback_address(peer):
        raise make_error(
            "admin_api_disabled",
            "without --control-plane-api-keys the admin API answers loopback clients only",
        )
    return None


def _unauthorized(message: str) -> TandemError:
    return make_error("invalid_api_key", message)
