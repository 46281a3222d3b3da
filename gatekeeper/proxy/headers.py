"""Which header fields the proxy passes on, each way (RFC 9110 section 7.6.1).

A proxy drops the hop-by-hop fields, which describe one connection and not the message:
``Connection`` and every field it names, ``Keep-Alive``, ``TE``, ``Trailer``,
``Transfer-Encoding``, ``Upgrade``, and ``Proxy-Connection``, ``Proxy-Authenticate``,
``Proxy-Authorization``; and the fields the HTTP layers set themselves (``Host``,
``Content-Length``; on answers ``Date`` and ``Server``). ``Expect`` is answered by the
sidecar's server (``100 Continue``) before the body is read, and never passed on.
Trailer fields never reach these lists: the sidecar's server and the proxy's client
both drop them (``sidecar.http_protocol``, ``upstream``).

Names are lower-case, as uvicorn and httptools give them.
"""

from __future__ import annotations

__all__ = ["HOP_BY_HOP", "answer_headers", "request_headers"]

_Headers = list[tuple[bytes, bytes]]

HOP_BY_HOP = frozenset(
    {
        b"connection", b"keep-alive", b"te", b"trailer", b"transfer-encoding", b"upgrade",
        b"proxy-connection", b"proxy-authenticate", b"proxy-authorization",
    }
)  # fmt: skip
_SKIP_REQUEST = frozenset({*HOP_BY_HOP, b"host", b"content-length", b"expect"})
_SKIP_ANSWER = frozenset({*HOP_BY_HOP, b"content-length", b"date", b"server"})
_PLAIN_CONNECTION = frozenset({b"keep-alive", b"close"})
"""Connection values that name no field beyond the hop-by-hop ones (the usual case)."""


def request_headers(headers: _Headers) -> _Headers:
    """A client's request fields to pass to a worker."""
    return _passed(headers, _SKIP_REQUEST)


def answer_headers(headers: _Headers) -> _Headers:
    """A worker's answer fields to pass to the client."""
    return _passed(headers, _SKIP_ANSWER)


def _passed(headers: _Headers, skip: frozenset[bytes]) -> _Headers:
    """``headers`` without those in ``skip`` and those a ``Connection`` field names."""
    kept = [(k, v) for k, v in headers if k not in skip]
    for name, value in headers:
        if name == b"connection" and value.lower() not in _PLAIN_CONNECTION:
            named = {token.strip().lower() for token in value.split(b",")}
            kept = [(k, v) for k, v in kept if k not in named]
    return kept
