"""A synchronous door to the async client, for plug-ins that live in someone else's hot path.

Triton calls its ``early_config_prune`` and its autotuning listener synchronously, from
whatever thread runs the kernel, possibly one that already runs an event loop (a Jupyter
kernel, an async training loop). ``asyncio.run`` would fail there, so a :class:`ClientPortal`
owns one event loop in a daemon thread of its own, opens one :class:`KperfClient` on it
(connections are reused across calls), and lets synchronous code submit coroutines to it with
a deadline. Background work (batched posts of measured runs) runs on the same loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Awaitable, Callable
from typing import TypeVar

from kperf_client.client import KperfClient

T = TypeVar("T")


class ClientPortal:
    """One background event loop and one open ``KperfClient(url)`` on it (``url`` None: the
    in-process service, ``KperfClient()``, built on the loop thread; it needs ``kperf[server]``).

    ``call`` blocks for at most ``timeout_s`` and raises what the coroutine raised (e.g.
    ``KperfError``, ``httpx.HTTPError``) or ``TimeoutError``; ``submit`` returns a future.
    The loop thread starts on first use; ``close`` stops it (also safe at interpreter exit).
    """

    def __init__(
        self, url: str | None, *, token: str | None = None, timeout_s: float = 5.0
    ) -> None:
        if url is not None and not url:
            raise ValueError("url: give the service's URL, e.g. http://127.0.0.1:8000")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s: must be > 0 s, got {timeout_s}")
        self.url = url if url is not None else "the in-process service"
        self._base_url = url
        self.token = token
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._client: KperfClient | None = None
        self._client_ready: asyncio.Lock | None = None
        self._closed = False

    # ------------------------------------------------------------------ loop thread

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._closed:
                raise RuntimeError("the portal is closed")
            if self._loop is None:
                loop = asyncio.new_event_loop()
                started = threading.Event()

                def run() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(started.set)
                    loop.run_forever()
                    loop.close()

                thread = threading.Thread(target=run, name="kperf-client-portal", daemon=True)
                thread.start()
                started.wait()
                self._loop, self._thread = loop, thread
            return self._loop

    async def _open_client(self) -> KperfClient:
        """The portal's client, opened on the loop thread on first use."""
        if self._client_ready is None:
            self._client_ready = asyncio.Lock()
        async with self._client_ready:
            if self._client is None:
                client = KperfClient(self._base_url, token=self.token, timeout_s=self.timeout_s)
                await client.__aenter__()
                self._client = client
            return self._client

    # ------------------------------------------------------------------ use

    def submit(self, work: Callable[[KperfClient], Awaitable[T]]) -> concurrent.futures.Future[T]:
        """Run ``work(client)`` on the loop thread; its future (not awaited here)."""

        return asyncio.run_coroutine_threadsafe(self.within(work), self._ensure_loop())

    def call(
        self, work: Callable[[KperfClient], Awaitable[T]], timeout_s: float | None = None
    ) -> T:
        """``work(client)`` on the loop thread, waited for at most ``timeout_s`` (default: the
        portal's): ``TimeoutError`` past it, and the work is cancelled."""
        wait_s = self.timeout_s if timeout_s is None else timeout_s
        future = self.submit(work)
        try:
            return future.result(wait_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"no answer from {self.url} within {wait_s} s") from None

    async def within(self, work: Callable[[KperfClient], Awaitable[T]]) -> T:
        """``work(client)``, awaited on the loop thread itself (background tasks)."""
        return await work(await self._open_client())

    def call_soon(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` on the loop thread (thread-safe)."""
        self._ensure_loop().call_soon_threadsafe(callback)

    def close(self, timeout_s: float = 5.0) -> None:
        """Close the client and stop the loop thread (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return

        async def shut() -> None:
            if self._client is not None:
                await self._client.__aexit__(None, None, None)
                self._client = None

        try:
            asyncio.run_coroutine_threadsafe(shut(), loop).result(timeout_s)
        except Exception:  # noqa: BLE001 - closing must not raise (it runs at exit too)
            pass
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout_s)
