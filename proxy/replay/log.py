"""The replay log: replay's own exchange records, written in batches off the answer's path."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

from noisefloor.proxy.store.log import Store, StoreError


class DeferredLog:
    """Buffers exchange records and writes them in one transaction a moment later, on the event loop.

    Used for the replay log, whose records matter for the summary and the analyzer but must not
    add latency to a replayed answer. A writer thread was tried first and measured worse: it took
    the GIL whenever the proxy released it for a socket send, so the answer waited for the log.
    Here the write runs between requests, batched. A proxy killed with SIGKILL loses at most the
    last `delay` seconds of replay records; recording stays synchronous (an answered exchange is
    on disk before the client sees the answer).

    A record that cannot be built is one request's problem: it goes to `on_error` and the rest of
    the batch is written. A failed write is the store's problem: it is raised again on the next
    submit or on close, never swallowed.
    """

    def __init__(self, store: Store, *, delay: float = 0.05, max_batch: int = 256,
                 on_error: Callable[[Exception], None] | None = None) -> None:
        self._store = store
        self._delay = delay
        self._max_batch = max_batch
        self._on_error = on_error
        self._pending: list[Callable[[], tuple[dict[str, Any], Mapping[str, bytes]]]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._failure: BaseException | None = None
        self.closes: Store | None = None  # a store of its own (--replay-log PATH), closed with it

    def submit(self, build: Callable[[], tuple[dict[str, Any], Mapping[str, bytes]]]) -> None:
        """Queue one exchange; `build` makes its record and bodies when the batch is written."""
        if self._failure is not None:
            raise StoreError(f"writing the log failed: {self._failure}")
        self._pending.append(build)
        if len(self._pending) >= self._max_batch:
            self.flush()
        elif self._timer is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # no proxy around it (a library caller): write now
                self.flush()
                return
            self._timer = loop.call_later(self._delay, self.flush)

    def flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch, self._pending = self._pending, []
        if not batch or self._failure is not None:
            return
        items = []
        for build in batch:
            try:
                items.append((*build(), None))
            except Exception as exc:  # noqa: BLE001 - one bad request must not cost the others their records
                self._lost(exc)
        try:
            self._store.append_many(items)
        except (ValueError, TypeError):  # a record the store cannot serialize: find it, keep the others
            for item in items:
                try:
                    self._store.append(*item)
                except (ValueError, TypeError) as exc:
                    self._lost(exc)
                except Exception as exc:  # noqa: BLE001 - the store itself: reported on the next submit
                    self._failure = exc
                    return
        except Exception as exc:  # noqa: BLE001 - reported on the next submit and on close
            self._failure = exc

    def _lost(self, exc: Exception) -> None:
        if self._on_error is None:
            raise exc
        self._on_error(exc)

    def close(self) -> None:
        try:
            self.flush()
        finally:
            if self.closes is not None:
                self.closes.close()
                self.closes = None
        if self._failure is not None:
            raise StoreError(f"writing the log failed: {self._failure}")
