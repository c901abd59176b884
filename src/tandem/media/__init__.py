"""Torch-free media acquisition shared by the gateway (router path) and the worker (media_refs).

Both paths build one ``MediaPolicy`` and go through the same functions, so a URL refused on
one path is refused on the other (docs/pd-contract.md §5):

    check_url / check_scheme   SSRF guard: scheme, domain allow-list, address check (guard)
    fetch_media / fetch_all    bytes from http(s) (guarded, manual redirects), data:, file://
    vet_media_url              everything fetch_media refuses up front, without fetching
    decode_image               bytes -> RGB PIL image, bomb- and format-checked (decode)
    media_hash                 BLAKE3 hex of the encoded bytes (hashing)

Errors are ``MediaError`` subclasses with stable ``code`` strings (errors).
"""

from tandem.media.decode import ALLOWED_FORMATS, decode_image
from tandem.media.errors import (
    MediaDecodeFailed,
    MediaError,
    MediaFetchFailed,
    MediaRefused,
    MediaTooLarge,
    describe_url,
)
from tandem.media.fetch import fetch_all, fetch_http, fetch_media, vet_media_url
from tandem.media.guard import (
    Resolver,
    VettedURL,
    check_scheme,
    check_url,
    is_forbidden_address,
    system_resolver,
    url_scheme,
    vet_host,
)
from tandem.media.hashing import media_hash
from tandem.media.inline import check_data_url, estimated_data_url_bytes, parse_data_url
from tandem.media.localfile import read_local_file, resolve_local_path
from tandem.media.policy import MediaPolicy
from tandem.media.transport import GuardedTransport, make_client
from tandem.media.types import FetchedMedia

__all__ = [
    "ALLOWED_FORMATS",
    "FetchedMedia",
    "GuardedTransport",
    "MediaDecodeFailed",
    "MediaError",
    "MediaFetchFailed",
    "MediaPolicy",
    "MediaRefused",
    "MediaTooLarge",
    "Resolver",
    "VettedURL",
    "check_data_url",
    "check_scheme",
    "check_url",
    "decode_image",
    "describe_url",
    "estimated_data_url_bytes",
    "fetch_all",
    "fetch_http",
    "fetch_media",
    "is_forbidden_address",
    "make_client",
    "media_hash",
    "parse_data_url",
    "read_local_file",
    "resolve_local_path",
    "system_resolver",
    "url_scheme",
    "vet_host",
    "vet_media_url",
]
