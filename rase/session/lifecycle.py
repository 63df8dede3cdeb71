"""How long a loaded model stays loaded: Ollama's keep_alive and `rase serve --keep-alive`.

A model's keep-alive is the last one a request gave it (else the engine's default; None: until
unloaded). Once its worker has had nothing to do for that long, a reaper thread unloads it; a
keep-alive of 0 unloads it as soon as it is idle. The next request loads it again.
"""
from __future__ import annotations

import threading
import time
import weakref



class KeepAlive:
    """The reaper of one Engine's sessions. default: seconds a model stays loaded once idle
    (None: until unloaded)."""

    TICK = 0.25  # seconds between looks at the idle models

    def __init__(self, sessions, default: float | None = None) -> None:
        self.sessions, self.default = sessions, default
        self._lock = threading.Lock()
        self._keep: dict[str, float | None] = {}   # model -> seconds (the last request's keep_alive)
        self._idle_since: dict[str, float] = {}    # model -> time.monotonic() its worker went idle
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if default is not None:
            self._start()

    def keep(self, model: str, seconds: float | None | bool = False) -> None:
        """A request for model set its keep-alive (seconds; None: forever; False: the default)."""
        with self._lock:
            self._keep[model] = self.default if seconds is False else seconds
            self._idle_since.pop(model, None)
            finite = any(v is not None for v in self._keep.values())
        if finite:
            self._start()

    def touch(self, model: str) -> None:
        """A request for model arrived: its idle time starts again once it is done."""
        with self._lock:
            self._idle_since.pop(model, None)

    def seconds(self, model: str) -> float | None:
        with self._lock:
            return self._keep.get(model, self.default)

    def expires(self, model: str, now: float) -> float | None:
        """When model unloads if nothing uses it (time.monotonic()), or None (never)."""
        with self._lock:
            keep = self._keep.get(model, self.default)
            if keep is None:
                return None
            return self._idle_since.get(model, now) + keep

    def _start(self) -> None:
        with self._lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=_reap, args=(weakref.ref(self), self._stop), daemon=True,
                                            name="rase-keep-alive")
        self._thread.start()

    def tick(self, now: float) -> list[str]:
        """Unload the models idle past their keep-alive; which were."""
        gone = []
        for (model, _), session in self.sessions.sessions():
            busy = session.worker is not None and session.worker.busy
            with self._lock:
                keep = self._keep.get(model, self.default)
                if busy or keep is None:
                    self._idle_since.pop(model, None)
                    continue
                since = self._idle_since.setdefault(model, now)
            if now - since >= keep:
                self.sessions.unload(model)
                with self._lock:
                    self._idle_since.pop(model, None)
                gone.append(model)
        return gone

    def close(self) -> None:
        self._stop.set()


def _reap(ref, stop: threading.Event) -> None:
    """The reaper thread: holds the KeepAlive weakly, so a dropped Engine's thread ends."""
    while not stop.wait(KeepAlive.TICK):
        keeper = ref()
        if keeper is None:
            return
        keeper.tick(time.monotonic())
        del keeper
