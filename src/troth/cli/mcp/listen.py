"""``promise-wait`` without polling: a listener on this process's own SSE stream.

One stream per token, opened on first use at ``GET /poll/{group}/{id}`` with a
random ``id``; a wait registers ``poll://uni@{group}/{id}`` as a listener on the
promise (``promise.register_listener``, the protocol's own way to be told of a
settlement) and sleeps until the server pushes the ``unblock`` or the wait's
timeout passes.  No request is made while it sleeps.

The race between "the promise settles" and "the listener is registered" is closed
by the registration itself: the server answers it with the promise as it is, in the
same transaction, so a promise already settled is returned at once and a pending one
is certain to send its ``unblock``.  The stream is connected *before* registering,
so the ``unblock`` has somewhere to go.  When the stream drops, every wait re-registers
once it is back (registering is idempotent) and so re-reads the promise: an
``unblock`` the server sent into the broken stream is not waited for in vain.

Listeners stay registered on promises whose wait timed out; their ``unblock`` later
arrives on the same stream (still open) and is dropped — one message, never a
failed delivery, as long as this process runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Any, Final

import httpx

from troth.cli.remote import RemoteError

log = logging.getLogger("troth.mcp")

#: Seconds between attempts to re-open a dropped stream (doubling up to the last).
RECONNECT: Final = (0.5, 1.0, 2.0, 5.0)

#: Seconds a stream no wait has used stays open (``Listeners``).
IDLE: Final = 600.0

#: ``(kind, data) -> data`` of one protocol request, raising RemoteError/Unreachable.
Call = Callable[[str, dict[str, Any]], Awaitable[Any]]


class Stream:
    """One SSE stream and the waits that listen on it."""

    def __init__(self, server: str, token: str | None, group: str) -> None:
        self.url = f"{server.rstrip('/')}/poll/{group}/troth-mcp-{secrets.token_hex(8)}"
        self.address = f"poll://uni@{group}/{self.url.rsplit('/', 1)[1]}"
        self.token = token
        self.waiters: dict[str, set[asyncio.Future[dict[str, Any]]]] = {}
        self.up = asyncio.Event()
        #: Set when the stream drops (a fresh Event each time it comes up).
        self.dropped = asyncio.Event()
        #: Why the stream cannot be opened (a refusal): waits fail with it.
        self.refused: RemoteError | None = None
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self.task is None or self.task.done():
            self.refused = None
            self.up.clear()
            self.task = asyncio.get_running_loop().create_task(self.run())

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task

    async def run(self) -> None:
        headers = {"accept": "text/event-stream"}
        if self.token:
            headers["authorization"] = f"Bearer {self.token}"
        attempt = 0
        timeout = httpx.Timeout(10.0, read=None)
        async with httpx.AsyncClient(timeout=timeout) as http:
            while True:
                try:
                    async with http.stream("GET", self.url, headers=headers) as r:
                        if r.status_code != 200:
                            body = (await r.aread()).decode(errors="replace")
                            try:
                                message = str(json.loads(body).get("error") or body)
                            except (ValueError, AttributeError):
                                message = body
                            if r.status_code in (401, 403, 404):
                                self._refuse(RemoteError("poll", r.status_code, message))
                                return
                            raise httpx.HTTPStatusError(message, request=r.request, response=r)
                        attempt = 0
                        self.dropped = asyncio.Event()
                        self.up.set()
                        await self._read(r)
                except (httpx.HTTPError, OSError) as exc:
                    log.warning("listener stream %s: %s", self.url, exc)
                except Exception:  # never let the stream die: the waits depend on it
                    log.exception("listener stream %s failed", self.url)
                self._drop()
                await asyncio.sleep(RECONNECT[min(attempt, len(RECONNECT) - 1)])
                attempt += 1

    def _drop(self) -> None:
        self.up.clear()
        self.dropped.set()

    def _refuse(self, exc: RemoteError) -> None:
        self.refused = exc
        self._drop()
        self.up.set()  # rouse the waits: they read ``refused``

    async def _read(self, r: httpx.Response) -> None:
        async for line in r.aiter_lines():
            if not line.startswith("data:"):
                continue
            try:
                message = json.loads(line[5:])
                promise = message["data"]["promise"]
                id = promise["id"]
            except (ValueError, KeyError, TypeError):
                continue  # not an unblock (a uni address receives nothing else)
            for fut in self.waiters.get(id, ()):
                if not fut.done():
                    fut.set_result(promise)

    async def wait(self, call: Call, id: str, seconds: float) -> dict[str, Any]:
        """``{"promise": …, "settled": bool}`` once ``id`` settles or ``seconds`` pass."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        fut: asyncio.Future[dict[str, Any]] = loop.create_future()
        self.waiters.setdefault(id, set()).add(fut)
        try:
            while True:
                self.start()
                if not await _until(self.up.wait(), deadline - loop.time()):
                    break
                if self.refused is not None:
                    raise RemoteError(
                        "promise-wait",
                        self.refused.status,
                        f"the token may not open this server's poll stream ({self.url}): "
                        f"{self.refused.message} (a token with a groups claim needs the "
                        "listener's group, see --listen-group)",
                    )
                dropped = self.dropped
                answer = await call(
                    "promise.register_listener", {"awaited": id, "address": self.address}
                )
                promise = answer.get("promise") if isinstance(answer, dict) else None
                if isinstance(promise, dict) and promise.get("state") != "pending":
                    return {"promise": promise, "settled": True}
                # Sleep until the unblock, a dropped stream, or the deadline.
                gone = loop.create_task(dropped.wait())
                try:
                    either: set[asyncio.Future[Any]] = {fut, gone}
                    await asyncio.wait(
                        either,
                        timeout=max(0.0, deadline - loop.time()),
                        return_when=asyncio.FIRST_COMPLETED,
                    )
                finally:
                    gone.cancel()
                if fut.done():
                    return {"promise": fut.result(), "settled": True}
                if not dropped.is_set():
                    break  # the deadline
            last = await call("promise.get", {"id": id})
            promise = last.get("promise") if isinstance(last, dict) else None
            settled = isinstance(promise, dict) and promise.get("state") != "pending"
            return {"promise": promise, "settled": settled}
        finally:
            waiting = self.waiters.get(id)
            if waiting is not None:
                waiting.discard(fut)
                if not waiting:
                    del self.waiters[id]


async def _until(aw: Awaitable[Any], seconds: float) -> bool:
    """Whether ``aw`` finished within ``seconds``."""
    try:
        await asyncio.wait_for(aw, max(0.0, seconds))
        return True
    except TimeoutError:
        return False


class Listeners:
    """The streams of one ``troth mcp`` process, one per token in use.

    Over HTTP each client may bring its own token (and tokens expire), so a stream
    nobody has waited on for :data:`IDLE` seconds is closed when another is asked for.
    """

    def __init__(self, server: str, group: str) -> None:
        self.server = server
        self.group = group
        self.streams: dict[str | None, Stream] = {}
        self.used: dict[str | None, float] = {}

    async def stream(self, token: str | None) -> Stream:
        now = asyncio.get_running_loop().time()
        for other, last in list(self.used.items()):
            if other != token and now - last > IDLE and not self.streams[other].waiters:
                del self.used[other]
                await self.streams.pop(other).close()
        self.used[token] = now
        stream = self.streams.get(token)
        if stream is None:
            stream = self.streams[token] = Stream(self.server, token, self.group)
        return stream

    async def close(self) -> None:
        for stream in self.streams.values():
            await stream.close()
