"""https through the pinned transport: the socket goes to the vetted IP while SNI and the
certificate check still use the URL's host name. Uses a throwaway self-signed certificate
made with the openssl CLI, and a made-up name that the injected resolver maps to loopback."""

from __future__ import annotations

import shutil
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from media_origin_server import OriginServer, start_origin

from tandem.media import MediaFetchFailed, MediaPolicy, fetch_media, make_client

FAKE_HOST = "images.example.test"
OTHER_HOST = "other.example.test"

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl CLI")


async def fake_dns(host: str, port: int) -> list[str]:
    if host in (FAKE_HOST, OTHER_HOST):
        return ["127.0.0.1"]
    raise MediaFetchFailed(f"test resolver does not know {host!r}")


@pytest.fixture(scope="module")
def tls_origin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[OriginServer, Path]]:
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-nodes", "-days", "1",
            "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-keyout", str(key), "-out", str(cert),
            "-subj", f"/CN={FAKE_HOST}", "-addext", f"subjectAltName=DNS:{FAKE_HOST}",
        ],
        check=True,
        capture_output=True,
        timeout=30,
    )  # fmt: skip
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(cert, key)
    seen_sni: list[str | None] = []
    server_ctx.sni_callback = lambda sock, name, ctx: seen_sni.append(name)
    server = start_origin()
    server.socket = server_ctx.wrap_socket(server.socket, server_side=True)
    server.seen_sni = seen_sni  # type: ignore[attr-defined]
    try:
        yield server, cert
    finally:
        server.state.stop.set()
        server.shutdown()
        server.server_close()


async def test_https_to_a_pinned_ip_keeps_sni_and_hostname_checks(
    tls_origin: tuple[OriginServer, Path],
) -> None:
    server, cert = tls_origin
    port = server.server_address[1]
    policy = MediaPolicy(allow_private_hosts=True)
    client_ctx = ssl.create_default_context(cafile=str(cert))
    async with make_client(policy, resolver=fake_dns, ssl_context=client_ctx) as client:
        fetched = await fetch_media(
            f"https://{FAKE_HOST}:{port}/img.png", policy, client=client, resolver=fake_dns
        )
        assert fetched.data == server.state.png
        assert fetched.source_scheme == "https"
        assert FAKE_HOST in server.seen_sni  # type: ignore[attr-defined]
        # Same IP, but the certificate does not name this host: verification must fail.
        with pytest.raises(MediaFetchFailed, match="certificate") as info:
            await fetch_media(
                f"https://{OTHER_HOST}:{port}/img.png", policy, client=client, resolver=fake_dns
            )
        assert info.value.retryable is False
