"""Running a live app: a uvicorn server on a socket bound to loopback, a clean shutdown.

On SIGINT/SIGTERM (or ``stop()``) the server stops accepting connections, tells the app to
drain (``/health`` turns 503, new requests get 503), lets in-flight streams run for
``drain_s`` seconds, then ends the ones still running with an error event, and exits.
``ServerThread`` runs the same server on a thread of its own (tests, notebooks).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import uvicorn

from fleetsim.errors import FleetsimInputError

LOOPBACK = "127.0.0.1"


def bind(host: str = LOOPBACK, port: int = 0) -> socket.socket:
    """A listening TCP socket (port 0: one the system picks)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as err:
        raise FleetsimInputError("--host", host, f"cannot resolve it ({err.strerror})") from None
    family = infos[0][0]
    # IPPROTO_TCP explicitly: asyncio turns Nagle off (TCP_NODELAY) only on sockets that say
    # so, and with Nagle on, a streamed token can wait ~40 ms for a delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        raise FleetsimInputError("--port", port, f"cannot listen on {host}:{port} "
                                 f"({err.strerror}); pick another port") from None
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://{host if ':' not in host else f'[{host}]'}:{port}"


class LiveApp:
    """What ``Server`` needs of an app: the ASGI callable and its drain hooks."""

    asgi: Any

    def begin_drain(self) -> None:
        """Refuse new work (``/health`` 503)."""

    def abort_in_flight(self, reason: str) -> None:
        """End whatever still runs with an error."""


class Server(uvicorn.Server):
    """uvicorn's server with the drain described above."""

    def __init__(self, app: LiveApp, *, drain_s: float, log_level: str = "warning") -> None:
        config = uvicorn.Config(app.asgi, log_level=log_level, lifespan="on",
                                timeout_graceful_shutdown=drain_s + 5.0,
                                timeout_keep_alive=30, access_log=False)
        super().__init__(config)
        self.live_app = app
        self.drain_s = drain_s

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.live_app.begin_drain()
        loop = asyncio.get_running_loop()
        handle = loop.call_later(self.drain_s, self.live_app.abort_in_flight,
                                 "the server is shutting down")
        try:
            await super().shutdown(sockets)
        finally:
            handle.cancel()


async def serve(app: LiveApp, sock: socket.socket, *, drain_s: float = 10.0,
                on_ready: Callable[[str], Awaitable[None] | None] | None = None,
                log_level: str = "warning") -> Server:
    """Serve ``app`` on ``sock`` until a signal or ``server.should_exit``."""
    server = Server(app, drain_s=drain_s, log_level=log_level)
    if on_ready is not None:
        loop = asyncio.get_running_loop()

        async def announce() -> None:
            while not server.started and not server.should_exit:
                await asyncio.sleep(0.01)
            result = on_ready(url_of(sock))
            if result is not None:
                await result

        ready = loop.create_task(announce())
    try:
        await server.serve(sockets=[sock])
    finally:
        if on_ready is not None:
            ready.cancel()
    return server


class ServerThread:
    """``app`` served on a thread with its own event loop, on a loopback port chosen now.

    ``with ServerThread(app) as url: ...`` starts it and always stops it. ``port``: a given
    one instead."""

    def __init__(self, make_app: Callable[[], LiveApp], *, drain_s: float = 2.0,
                 start_timeout_s: float = 30.0, port: int = 0) -> None:
        self._make_app = make_app
        self._drain_s = drain_s
        self._start_timeout_s = start_timeout_s
        self.sock = bind(port=port)
        self.url = url_of(self.sock)
        self.app: LiveApp | None = None
        self.server: Server | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name=f"live {self.url}", daemon=True)

    def _main(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as err:  # reported by start()
            self._error = err
        finally:
            self._started.set()

    async def _serve(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.app = self._make_app()
        self.server = Server(self.app, drain_s=self._drain_s)

        async def announce() -> None:
            while not self.server.started and not self.server.should_exit:  # type: ignore[union-attr]
                await asyncio.sleep(0.005)
            self._started.set()

        task = self.loop.create_task(announce())
        try:
            await self.server.serve(sockets=[self.sock])
        finally:
            task.cancel()
            self.sock.close()

    def start(self) -> str:
        self._thread.start()
        if not self._started.wait(self._start_timeout_s):
            self.stop()
            raise TimeoutError(f"server at {self.url} did not start")
        if self._error is not None:
            raise RuntimeError(f"server at {self.url} failed to start") from self._error
        return self.url

    def call(self, fn: Callable[[], Any], timeout_s: float = 10.0) -> Any:
        """Run ``fn`` on the server's loop and return its result."""
        assert self.loop is not None

        async def run() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout_s)

    def stop(self, timeout_s: float = 30.0) -> None:
        """Shut down (draining as on SIGTERM) and join the thread."""
        if self.server is not None:
            self.server.should_exit = True
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            if self.server is not None:
                self.server.force_exit = True
            self._thread.join(timeout_s)

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def quiet_access_logs() -> None:
    logging.getLogger("uvicorn.access").setLevel(logging.WARNING)
