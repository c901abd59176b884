"""A PostgreSQL URL may hold a password: how it is shown in logs and error messages."""

from __future__ import annotations

from urllib.parse import parse_qsl, unquote, urlsplit

MASK = "***"


def _secrets(url: str) -> list[str]:
    """The password as written in the URL, decoded, and any ``password=`` query value."""
    try:
        parts = urlsplit(url)
        password = parts.password
        query = parse_qsl(parts.query, keep_blank_values=True)
    except ValueError:  # unparseable: the whole URL is the secret
        return [url]
    found = [password, unquote(password)] if password else []
    found += [value for key, value in query if key.lower() == "password" and value]
    # Longest first, so that a secret containing another is masked whole.
    return sorted({s for s in found if s}, key=len, reverse=True)


def redacted(url: str) -> str:
    """``postgresql://user:***@host:port/db``; the query (it may hold one too) is dropped."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return "postgresql://" + MASK
    user = f"{parts.username}{':' + MASK if parts.password else ''}@" if parts.username else ""
    if ":" in host:  # an IPv6 literal keeps its brackets
        host = f"[{host}]"
    netloc = f"{user}{host}{f':{port}' if port else ''}"
    query = "?" + MASK if parts.query else ""
    return f"{parts.scheme}://{netloc}{parts.path}{query}"


def scrubbed(text: str, url: str) -> str:
    """``text`` with the URL shown redacted and every form of its password masked."""
    text = text.replace(url, redacted(url))
    for secret in _secrets(url):
        text = text.replace(secret, MASK)
    return text
