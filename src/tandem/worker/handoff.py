"""The worker's half of the prefill/decode KV handoff.

Prefill leg (``do_remote_decode``): the engine keeps the prompt KV under a
transfer id (the gateway's, when it minted one) and the Complete frame tells
the decode worker where to pull it from.

Decode leg (``do_remote_prefill``): reuse the local prefix cache, pull only the
missing tokens (all but the last prompt position, which is recomputed) and
release the prefill worker's lease in the same call.

A decode leg that carries no media of its own (SGLang's, whose two legs meet at a
bootstrap room) first asks the prefill worker to describe what it holds
(:func:`import_described`): the prompt's size and digest, and the pixel-free media
description whose items key the prefix cache exactly as the prefill keyed it.
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass
from typing import Any, TypeGuard

from tandem.engine.block_keys import block_keys
from tandem.engine.protocol import PrefixLookup
from tandem.engine.types import KVLayers, MediaInputs, MediaItem
from tandem.hostport import bare_host, check_host, join_host_port, split_url
from tandem.worker.kv_channel import KvChannelClient, concat_kv, tokens_digest
from tandem.worker.kv_media import media_from_json

log = logging.getLogger("tandem.worker.handoff")


@dataclass(slots=True)
class RemoteKv:
    """Where a decode leg's KV lives."""

    address: str
    transfer_id: str
    minted: bool  # the gateway minted the id: the prefill may still be running

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> RemoteKv:
        host, port = params.get("remote_host"), params.get("remote_port")
        bootstrap = params.get("remote_bootstrap_addr")
        if (not host or not port) and isinstance(bootstrap, str):
            # Mooncake-style params name the prefill worker as "http://host:port" (an IPv6
            # host in brackets).
            try:
                host, port = split_url(bootstrap, "http")
            except ValueError as exc:
                raise ValueError(f"do_remote_prefill: remote_bootstrap_addr: {exc}") from None
        transfer_id = params.get("transfer_id")
        if (
            not isinstance(host, str)
            or not host
            or not isinstance(port, int)
            or not 0 < port < 65536
        ):
            raise ValueError("do_remote_prefill needs remote_host and remote_port (1..65535)")
        if not isinstance(transfer_id, str) or not transfer_id:
            raise ValueError("do_remote_prefill needs a transfer_id")
        # Params relayed from a prefill answer carry num_tokens: that KV already exists.
        # Without it the gateway minted the id and the prefill may still be running.
        # remote_host is bare ("::1", as vLLM's params carry it); the dial target brackets it.
        address = join_host_port(check_host(host, "remote_host"), port)
        return cls(address, transfer_id, "num_tokens" not in params)


def wants_export(params: dict[str, Any] | None) -> TypeGuard[dict[str, Any]]:
    return bool(params and params.get("do_remote_decode"))


def wants_import(params: dict[str, Any] | None) -> TypeGuard[dict[str, Any]]:
    return bool(params and params.get("do_remote_prefill"))


def export_transfer_id(params: dict[str, Any], request_id: str) -> str:
    minted = params.get("transfer_id")
    return minted if isinstance(minted, str) and minted else f"{request_id}-{uuid.uuid4().hex}"


def export_params(transfer_id: str, host: str, port: int, engine_id: str, num_tokens: int) -> str:
    """The JSON a prefill leg answers with; the gateway relays it verbatim to decode."""
    return json.dumps(
        {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "transfer_id": transfer_id,
            "remote_host": bare_host(host),
            "remote_port": port,
            "remote_engine_id": engine_id,
            "num_tokens": num_tokens,
        },
        separators=(",", ":"),
    )


async def import_kv(
    client: KvChannelClient,
    cache: PrefixLookup,
    remote: RemoteKv,
    prompt: list[int],
    items: list[MediaItem],
    salt: str | None,
    wait_s: float,
) -> tuple[KVLayers, int]:
    """KV of ``prompt[:-1]``: local prefix-cache blocks plus what is pulled; and the hits."""
    need = len(prompt) - 1
    keys = block_keys(prompt, items, salt, cache.block_size)
    n_blocks, local = cache.match_prefix(keys[: need // cache.block_size])
    have = n_blocks * cache.block_size
    pulled = await client.pull(
        remote.address,
        remote.transfer_id,
        prompt,
        have,
        need,
        release=True,
        wait_s=wait_s if remote.minted else 0.0,
    )
    parts = [local] if n_blocks else []
    parts.append(pulled)
    return concat_kv(parts, client.shape), have


@dataclass(slots=True)
class DescribedKv:
    """What a described decode leg imported: the KV, its local hits, the prefill's media."""

    kv: KVLayers
    local_cached_tokens: int
    media: MediaInputs | None


async def import_described(
    client: KvChannelClient,
    cache: PrefixLookup,
    remote: RemoteKv,
    prompt: list[int],
    wait_s: float,
) -> DescribedKv:
    """Describe ``remote`` (waiting up to ``wait_s`` for it), then import like
    :func:`import_kv` with the prefill's media items and no salt.

    The pull itself waits for nothing: the KV is held once Describe answered.
    """
    reply = await client.describe(remote.address, remote.transfer_id, wait_s)
    held = reply.get("num_tokens")
    if held != len(prompt) or reply.get("tokens_digest") != tokens_digest(prompt):
        raise ValueError(
            f"transfer {remote.transfer_id!r} holds KV of {held} tokens for a different "
            f"prompt than the decode leg's {len(prompt)} tokens"
        )
    media = media_from_json(reply.get("media"))
    held_remote = RemoteKv(remote.address, remote.transfer_id, minted=False)
    items = media.items if media else []
    kv, hits = await import_kv(client, cache, held_remote, prompt, items, None, 0.0)
    return DescribedKv(kv, hits, media)


async def release_quietly(client: KvChannelClient, remote: RemoteKv, wait_s: float = 0.0) -> bool:
    """Tell the prefill worker to drop the KV now; a failure here only costs the lease.

    ``wait_s``: the KV may not be held yet (a prefill leg sent at the same time): the
    prefill worker waits that long for it before it answers. True when it was released.
    """
    try:
        return await client.release(remote.address, remote.transfer_id, wait_s)
    except Exception as exc:
        log.info("could not release transfer %s at %s: %s", remote.transfer_id, remote.address, exc)
        return False
