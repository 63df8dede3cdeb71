"""Real server processes and threads for the tests: the `rase` command, `rase serve` on a free
port, a host app on uvicorn in a thread, the browser the chat page is driven with."""
from __future__ import annotations

import contextlib
import os
import shutil
import socket
import sysconfig
import threading
import time
from pathlib import Path

import httpx
import pytest


def rase_command() -> list[str]:
    """The `rase` console script pip installed beside this interpreter (the venv's bin/, which
    need not be on PATH: CI runs .venv/bin/python without activating the venv)."""
    return [str(Path(sysconfig.get_path("scripts")) / "rase")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(base: str, proc, timeout: float) -> bool:
    """True once base/health answers 200; False when proc exits or timeout seconds pass first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(base + "/health", timeout=2).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    return False


@contextlib.contextmanager
def rase_serve(store, *args: str, env: dict | None = None, with_process: bool = False):
    """A real `rase serve` process over store on a free port (extra CLI args after the port,
    extra environment variables in env); yields its base URL once /health answers (with
    with_process, (base, Popen)), terminates it after."""
    import subprocess

    port = free_port()
    proc = subprocess.Popen([*rase_command(), "--store", str(store), "serve", "--port", str(port), *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})
    base = f"http://127.0.0.1:{port}"
    try:
        if not wait_healthy(base, proc, timeout=60):
            proc.kill()
            pytest.fail(f"rase serve did not start: {proc.stderr.read()}")
        yield (base, proc) if with_process else base
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        proc.stderr.close()


def serve_in_thread(app):
    """app on uvicorn in a thread of this process: (server, thread, base URL) once it answers."""
    import uvicorn

    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    t = threading.Thread(target=srv.run, daemon=True)
    t.start()
    base = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            httpx.get(base + "/health", timeout=1)
            break
        except httpx.HTTPError:
            time.sleep(0.05)
    return srv, t, base


def browser_paths() -> tuple[str, str]:
    chromium = os.environ.get("RASE_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    driver = os.environ.get("RASE_CHROMEDRIVER") or shutil.which("chromedriver")
    if not (chromium and driver):
        pytest.fail("the chat-page tests need Chromium and chromedriver: run tools/install-test-deps.sh "
                    "(or set RASE_CHROMIUM and RASE_CHROMEDRIVER)")
    return chromium, driver
