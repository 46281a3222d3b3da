"""The HTTP servers ``gatekeeper serve`` can run the app under (``http_server``), each on
the listening socket ``serve`` bound, with the app's lifespan, until SIGINT or SIGTERM:

- ``gatekeeper`` (the default): uvicorn with the sidecar's own protocol
  (``http_protocol``): every limit of ``http_limits`` and the lean path.
- ``uvicorn``: uvicorn's stock httptools protocol with the same app: its keep-alive
  timeout only; no bound on a request head (one client sending header lines without end
  grows the sidecar by gigabytes, issue #27), no header or body deadline.
- ``granian`` (the ``http-alt`` extra; imported only here and only then): granian's
  embedded server (Rust, hyper) through ASGI: the head bounded by its HTTP/1 read buffer
  (``max_request_head_bytes``, at least granian's 8192) and hyper's 100 fields (431
  either way), the headers' time by its header read timeout
  (``request_header_timeout_seconds``, at most its 60 s); no body deadline.

``missing_limits`` is the one warning line ``serve`` prints for the last two.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette

from gatekeeper.errors import GatekeeperError
from gatekeeper.settings import Settings

if TYPE_CHECKING:  # granian is optional (the http-alt extra), imported when chosen
    from granian.http import HTTP1Settings

__all__ = ["GRANIAN_MIN_BUFFER_BYTES", "LISTEN_BACKLOG", "missing_limits", "server"]

GRANIAN_MIN_BUFFER_BYTES = 8192
"""granian's smallest HTTP/1 read buffer (``--http1-buffer-size``)."""
LISTEN_BACKLOG = 2048
"""The listening socket's backlog (``cli.serve`` binds it)."""
GRANIAN_MAX_HEADER_MS = 60_000
"""granian's longest header read timeout (``--http1-header-read-timeout``), in ms."""

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_BODY = (
    "request_body_timeout_seconds, request_body_total_seconds, request_body_min_bytes_per_second, "
    "request_body_max_seconds"
)
_MISSING = {
    "gatekeeper": None,
    "uvicorn": (
        "no bound on request heads (max_request_head_bytes, max_request_headers: one client "
        "can grow the sidecar's memory without end), no header deadline "
        f"(request_header_timeout_seconds), no body deadlines ({_BODY})"
    ),
    "granian": ("no body deadlines (" + _BODY + "); max_request_headers is granian's fixed 100"),
}


def missing_limits(settings: Settings) -> str | None:
    """The one line that says which of the sidecar's limits ``settings.http_server``
    does not give (None: it gives them all)."""
    missing = _MISSING[settings.http_server]
    if missing is None:
        return None
    if settings.http_server == "granian":
        missing += "".join(_granian_caps(settings))
    return (
        f"http_server = {settings.http_server}: {missing}; set http_server = gatekeeper "
        "(GATEKEEPER_HTTP_SERVER) for all of them"
    )


def _granian_caps(settings: Settings) -> list[str]:
    """Where granian's own range moves a setting: said, not done silently."""
    caps = []
    if settings.request_header_timeout_seconds * 1000 > GRANIAN_MAX_HEADER_MS:
        caps.append(
            f"; request_header_timeout_seconds is its most, {GRANIAN_MAX_HEADER_MS // 1000}"
        )
    if settings.max_request_head_bytes < GRANIAN_MIN_BUFFER_BYTES:
        caps.append(f"; max_request_head_bytes is its least, {GRANIAN_MIN_BUFFER_BYTES}")
    return caps


@dataclass(frozen=True, slots=True)
class Serving:
    """A server set up to run: ``run()`` serves until SIGINT or SIGTERM (the server takes
    the signals over while it runs); ``stop()`` asks it to end, also before it has taken
    them over (a signal the command held from its banner on)."""

    run: Callable[[], None]
    stop: Callable[[], None]


def server(app: Starlette, sock: socket.socket, settings: Settings) -> Serving:
    """The server ``settings.http_server`` names, set up to run ``app`` on ``sock``. Set up
    before the sidecar's logging is (each server configures its own loggers when built;
    the sidecar's configuration then wins)."""
    build: Callable[[Starlette, socket.socket, Settings], Serving] = {
        "gatekeeper": _gatekeeper,
        "uvicorn": _uvicorn,
        "granian": _granian,
    }[settings.http_server]
    return build(app, sock, settings)


def _gatekeeper(
    app: Starlette, sock: socket.socket, settings: Settings, *, http: str | None = None
) -> Serving:
    import uvicorn

    from gatekeeper.sidecar.http_protocol import server_config

    host, port = sock.getsockname()[:2]
    config = server_config(app, host=host, port=port, settings=settings)
    if http is not None:
        config.http = http  # in place of the sidecar's protocol (read at load)
    running = uvicorn.Server(config)

    def stop() -> None:  # uvicorn checks it after start-up and in its main loop
        running.should_exit = True

    return Serving(lambda: running.run(sockets=[sock]), stop)


def _uvicorn(app: Starlette, sock: socket.socket, settings: Settings) -> Serving:
    return _gatekeeper(app, sock, settings, http="httptools")  # uvicorn's own protocol


def _granian(app: Starlette, sock: socket.socket, settings: Settings) -> Serving:
    import uvloop

    embedded = _granian_server(app, sock, settings)

    caught: list[signal.Signals] = []
    asked: list[bool] = []

    def stop(signum: signal.Signals) -> None:
        caught.append(signum)
        embedded.stop()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for signum in _STOP_SIGNALS:
            loop.add_signal_handler(signum, stop, signum)
        if not asked:  # told to stop before the loop ran: do not start
            await embedded.serve()

    def run() -> None:
        handlers = {signum: signal.getsignal(signum) for signum in _STOP_SIGNALS}
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(main())
        # as uvicorn does: the signal, once the server has stopped, ends the command
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
        for first in caught[:1]:
            signal.raise_signal(first)
        if embedded.interrupt_children:
            raise GatekeeperError(
                "http_server: granian's worker ended before the sidecar was stopped (its "
                "lifespan failed or it crashed; the log above says why); fix that, or set "
                "http_server = gatekeeper",
                field="http_server",
                value="granian",
            )

    return Serving(run, lambda: asked.append(True))


def _granian_server(app: Starlette, sock: socket.socket, settings: Settings) -> Any:
    """granian's embedded server serving on ``sock`` (not a socket of its own). Through
    two private names of granian 2.8 (``Server._init_shared_socket``, ``SocketHolder``),
    which is why the extra pins it below 2.9."""
    try:
        from granian._granian import SocketHolder
        from granian.constants import HTTPModes, Interfaces
        from granian.http import HTTP1Settings
        from granian.log import LogLevels
        from granian.server.embed import Server
    except ImportError as e:
        raise GatekeeperError(
            f"http_server: granian is not installed ({e}); install the http-alt extra "
            "(pip install 'gatekeeper[http-alt]') or set http_server = gatekeeper",
            field="http_server",
            value="granian",
        ) from None

    class _OnOurSocket(Server):
        def _init_shared_socket(self) -> None:
            _share_socket(self, SocketHolder, sock)

    host, port = sock.getsockname()[:2]
    embedded = _OnOurSocket(
        app,
        address=host,
        port=port,
        interface=Interfaces.ASGI,
        http=HTTPModes.http1,
        websockets=False,
        http1_settings=_granian_http1(HTTP1Settings, settings),
        # granian's lines go to the sidecar's own log handlers, errors only
        log_level=LogLevels.error,
        log_dictconfig={"loggers": {"_granian": {"propagate": True}}},
    )
    return embedded


def _share_socket(server: Any, socket_holder: Any, sock: socket.socket) -> None:
    """Points granian's embedded ``server`` at ``sock`` (its ``_init_shared_socket``)."""
    # a copy of the descriptor: granian's holder may close its own
    fd = os.dup(sock.fileno())
    # Accepted sockets inherit it (Linux): without it each streamed chunk waited
    # for the client's delayed ACK, 40 ms (uvicorn's asyncio sets it per socket).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    # granian's stub gives SocketHolder one argument, the extension three (fd, uds, backlog)
    server._ssp, server._shd = None, socket_holder(fd, False, LISTEN_BACKLOG)
    server._sfd = fd


def _granian_http1(http1_settings: type[HTTP1Settings], settings: Settings) -> HTTP1Settings:
    """granian's HTTP/1 settings: the header timeout and head size, within its bounds."""
    header_ms = round(1000 * settings.request_header_timeout_seconds)
    return http1_settings(
        header_read_timeout=max(1, min(header_ms, GRANIAN_MAX_HEADER_MS)),
        max_buffer_size=max(GRANIAN_MIN_BUFFER_BYTES, settings.max_request_head_bytes),
    )
