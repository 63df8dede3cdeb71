"""RequestHandle: the one bridge between a model's worker thread and every surface.

The worker pushes one output.Output per token that shows something, then exactly one end (a
Completion, or an exception); the consumer reads them from any thread (`outputs()`) or event
loop (`aoutputs()`), or waits for the end (`result()`, `await aresult()`). Iterating the handle
itself (`for d in handle`, `async for d in handle`) gives the Python API's stream items
(output.python_items: text, and reasoning, tool-call and logprob items). `cancel()` may be
called from anywhere at any time; the request leaves the batch at the next step and still ends
(with finish_reason "cancelled"). Closing an iterator early cancels.
"""
from __future__ import annotations

import asyncio
import queue
import threading
from typing import AsyncIterator, Callable, Iterator

from ..output import Completion, Output, python_items

_OUTPUT, _END, _ERROR = 0, 1, 2
STOP_WAIT_S = 30.0  # a cancelled request ends within one step; closing a stream waits that long at most


class RequestHandle:
    def __init__(self, on_cancel: Callable[[], None] = lambda: None) -> None:
        self._items: queue.SimpleQueue = queue.SimpleQueue()
        self._on_cancel = on_cancel
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []
        self._outcome: tuple[int, object] | None = None
        self.cancelled = False
        self.request = None  # the worker's Request behind it (opaque to consumers)

    # ---------------------------------------------------------------- worker side

    def _put(self, item: tuple[int, object]) -> None:
        self._items.put(item)
        with self._lock:
            waiters = list(self._waiters)
        for loop, event in waiters:
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:  # that loop is closed: its consumer is gone
                pass

    def push(self, out: Output) -> None:
        if out:
            self._put((_OUTPUT, out))

    def finish(self, completion: Completion) -> None:
        self._end((_END, completion))

    def fail(self, error: BaseException) -> None:
        self._end((_ERROR, error))

    def _end(self, item: tuple[int, object]) -> None:
        with self._lock:
            if self._outcome is not None:
                return
            self._outcome = item
        self._put(item)
        self._done.set()

    # ---------------------------------------------------------------- consumer side

    def cancel(self) -> None:
        if not self._done.is_set() and not self.cancelled:
            self.cancelled = True
            self._on_cancel()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def _outcome_value(self) -> Completion:
        kind, value = self._outcome
        if kind == _ERROR:
            raise value
        return value

    def result(self, timeout: float | None = None) -> Completion:
        """Wait for the end; the Completion, or the request's error raised."""
        if not self._done.wait(timeout):
            raise TimeoutError("the request has not finished")
        return self._outcome_value()

    def next_output(self, timeout: float | None = None) -> Output | None:
        """The next Output; None on timeout; StopIteration at the end (errors raised)."""
        try:
            kind, value = self._items.get(timeout=timeout)
        except queue.Empty:
            return None
        if kind == _OUTPUT:
            return value
        self._items.put((kind, value))  # the end stays visible to later reads
        if kind == _ERROR:
            raise value
        raise StopIteration

    def outputs(self) -> Iterator[Output]:
        """Every Output until the end (errors raised); leaving early cancels the request and
        returns once it has stopped."""
        try:
            while True:
                try:
                    out = self.next_output()
                except StopIteration:
                    return
                yield out
        finally:
            if not self.done:
                self.cancel()
                self._done.wait(timeout=STOP_WAIT_S)

    def __iter__(self) -> Iterator:
        outputs = self.outputs()
        try:
            for out in outputs:
                yield from python_items(out)
        finally:
            outputs.close()  # left early: cancel, and wait for the stop

    async def _next(self) -> tuple[int, object]:
        loop = asyncio.get_running_loop()
        event = asyncio.Event()
        with self._lock:
            self._waiters.append((loop, event))
        try:
            while True:
                try:
                    return self._items.get_nowait()
                except queue.Empty:
                    pass
                event.clear()
                try:  # a put between get_nowait and clear is seen here
                    return self._items.get_nowait()
                except queue.Empty:
                    pass
                await event.wait()
        finally:
            with self._lock:
                self._waiters.remove((loop, event))

    async def aoutputs(self) -> AsyncIterator[Output]:
        """Every Output until the end, from an event loop; leaving early cancels the request."""
        try:
            while True:
                kind, value = await self._next()
                if kind == _OUTPUT:
                    yield value
                    continue
                self._items.put((kind, value))
                if kind == _ERROR:
                    raise value
                return
        finally:
            self.cancel()

    async def __aiter__(self) -> AsyncIterator:
        try:
            async for out in self.aoutputs():
                for item in python_items(out):
                    yield item
        finally:
            self.cancel()

    async def aresult(self) -> Completion:
        """Await the end; cancelling the awaiting task cancels the request."""
        try:
            while not self.done:
                kind, value = await self._next()
                if kind != _OUTPUT:
                    self._items.put((kind, value))
            return self._outcome_value()
        except asyncio.CancelledError:
            self.cancel()
            raise
