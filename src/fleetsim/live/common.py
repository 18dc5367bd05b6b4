"""Pieces both servers share: the Starlette app skeleton, error handlers, disconnect
watching."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute

from fleetsim.live.protocol import error_body


def make_starlette(routes: Sequence[BaseRoute],
                   lifespan: Callable[[Any], AbstractAsyncContextManager[None]]) -> Starlette:
    """An app whose every error (404, 405, 500) is an OpenAI error object."""

    async def http_error(request: HttpRequest, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        return JSONResponse(error_body(str(exc.detail), kind, code=str(exc.status_code)),
                            status_code=exc.status_code, headers=exc.headers)

    async def server_error(request: HttpRequest, exc: Exception) -> Response:
        return JSONResponse(error_body(f"internal error: {type(exc).__name__}: {exc}",
                                       "server_error", code="internal_error"), status_code=500)

    return Starlette(routes=list(routes), lifespan=lifespan,
                     exception_handlers={HTTPException: http_error, Exception: server_error})


async def version(request: HttpRequest) -> Response:
    """``GET /version``, as vLLM answers it (``{"version": ...}``): fleetsim's version."""
    from fleetsim import __version__

    return JSONResponse({"version": __version__, "server": "fleetsim"})


async def until_disconnect(request: HttpRequest) -> None:
    """Returns when the client has gone (call after the body was read)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def wait_or_disconnect(request: HttpRequest, event: asyncio.Event,
                             timeout_s: float) -> bool:
    """Wait for ``event``; False if the client disconnected first. TimeoutError after
    ``timeout_s``."""
    waiter = asyncio.ensure_future(event.wait())
    gone = asyncio.ensure_future(until_disconnect(request))
    try:
        done, _ = await asyncio.wait({waiter, gone}, timeout=timeout_s,
                                     return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
        gone.cancel()
    if waiter in done:
        return True
    if gone in done:
        return False
    raise TimeoutError

