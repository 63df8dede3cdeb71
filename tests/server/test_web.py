"""The chat page at / in a real headless Chromium (Selenium) against a real `rase serve --api-key`.

The browser is conftest's `browser` fixture (tools/install-test-deps.sh). A screenshot of the page goes to build/test-artifacts/.
"""
from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import httpx
import pytest

from tests.support.servers import rase_serve

pytestmark = pytest.mark.needs_model  # every test here runs a real model (tests/conftest.py)

KEY = "page-test-key"
ARTIFACTS = Path(os.environ.get("RASE_TEST_ARTIFACTS") or Path(__file__).parents[2] / "build" / "test-artifacts")
SYSTEM = "You are a helpful assistant."


@pytest.fixture(scope="module")
def base(smollm2_store):
    with rase_serve(smollm2_store, "--threads", "2", "--api-key", KEY) as url:
        yield url


def _wait(pred, timeout: float = 60.0, what: str = "condition"):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = pred()
        if got:
            return got
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}")


def _js(d, script: str, *args):
    return d.execute_script(script, *args)


def _running(d) -> bool:
    return "running" in (_js(d, "return document.body.className") or "")


def _answer_text(d) -> str:
    return _js(d, "const b = document.querySelector('.msg.assistant:last-child .body'); return b ? b.textContent : ''")


def _stored(d) -> dict:
    return json.loads(_js(d, "return localStorage.getItem('rase-chat')"))


def _open_with_key(d, base: str):
    """Load the page: without the key it says one is needed; with it the model list appears."""
    from selenium.webdriver.common.by import By

    d.get(base + "/")
    notice = _wait(lambda: d.find_element(By.ID, "notice").text, 20, "the API-key notice")
    assert "API key" in notice and not d.find_element(By.ID, "model").get_attribute("value")
    key = d.find_element(By.ID, "api-key")
    key.send_keys(KEY)
    d.find_element(By.ID, "system").click()  # blur: the key is saved and the models reloaded
    _wait(lambda: d.find_element(By.ID, "model").get_attribute("value") == "smollm2", 20, "the model picker")
    assert not d.find_element(By.ID, "notice").is_displayed()


def _settings(d, **fields):
    from selenium.webdriver.common.by import By

    for name, value in fields.items():
        el = d.find_element(By.ID, name)
        el.clear()
        el.send_keys(str(value))


def _send(d, text: str):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    box = d.find_element(By.ID, "input")
    box.send_keys(text)
    box.send_keys(Keys.ENTER)


def _pace_sse(d, ms: int):
    """Hand the page one SSE event per read, `ms` apart, as a slow network would.

    The model streams a short answer in ~30 ms, which one socket read can hold whole, so without
    this a page that renders per event and one that renders at the end can look alike. The page's
    own code is untouched: only `fetch`'s body for /chat/completions is re-chunked at event bounds.
    """
    _js(d, """const realFetch = window.fetch, ms = arguments[0];
    window.fetch = async (...args) => {
      const res = await realFetch(...args);
      if (!res.body || !String(args[0]).includes('/chat/completions')) return res;
      const enc = new TextEncoder(), dec = new TextDecoder();
      let buf = "";
      const paced = res.body.pipeThrough(new TransformStream({
        async transform(bytes, out) {
          buf += dec.decode(bytes, {stream: true});
          for (let cut; (cut = buf.indexOf("\\n\\n")) >= 0; buf = buf.slice(cut + 2)) {
            out.enqueue(enc.encode(buf.slice(0, cut + 2)));
            await new Promise(r => setTimeout(r, ms));
          }
        },
        flush(out) { if (buf) out.enqueue(enc.encode(buf)); },
      }));
      return new Response(paced, {status: res.status, statusText: res.statusText, headers: res.headers});
    };""", ms)


def _no_foreign_requests(d, base: str):
    urls = _js(d, "return performance.getEntriesByType('resource').map(e => e.name)")
    assert urls and all(u.startswith(base + "/") for u in urls), urls


def test_page_is_served_without_the_key_and_locks_itself_down(base):
    page = httpx.get(base + "/", timeout=10)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    csp = page.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "script-src 'self'" in csp and "connect-src 'self'" in csp
    for src in re.findall(r'(?:src|href)="([^"]+)"', page.text):
        assert src == "data:," or src.startswith("web/"), src  # nothing from another origin
        if src.startswith("web/"):
            assert httpx.get(f"{base}/{src}", timeout=10).status_code == 200
    assert httpx.get(base + "/web/secrets.txt", timeout=10).status_code == 404
    assert httpx.get(base + "/web/..%2Fapp.py", timeout=10).status_code == 404
    assert httpx.get(base + "/v1/models", timeout=10).status_code == 401  # the API still needs it


def test_streams_a_multi_turn_chat_equal_to_the_api(browser, base, openai_client):
    d = browser
    _open_with_key(d, base)
    _settings(d, system=SYSTEM, temperature=0, **{"max-tokens": 64})
    # every length the answer's text takes in the DOM: it appears piece by piece, not at the end
    _js(d, """window.seen = []; new MutationObserver(() => {
        const b = document.querySelector('.msg.assistant:last-child .body');
        if (b) window.seen.push(b.textContent.length); }).observe(
        document.getElementById('messages'), {childList: true, subtree: true, characterData: true});""")
    _pace_sse(d, ms=20)
    _send(d, "What is the capital of France?")
    _wait(lambda: not _running(d) and _js(d, "return document.querySelectorAll('.msg.assistant').length") == 1,
          60, "the answer")
    final = _answer_text(d)
    lengths = set(_js(d, "return window.seen"))
    assert len({n for n in lengths if 0 < n < len(final)}) >= 2, lengths
    stats = _js(d, "return document.querySelector('.msg.assistant:last-child .stats').textContent")
    assert re.search(r"TTFT \d+ ms · [\d.]+ tokens/s · \d+ tokens", stats), stats

    _send(d, "And what is the capital of Italy?")
    _wait(lambda: not _running(d) and len(_js(d, "return document.querySelectorAll('.msg')")) == 4, 60, "turn 2")
    conv = _stored(d)["conversations"][0]
    assert [m["role"] for m in conv["messages"]] == ["user", "assistant", "user", "assistant"]

    # the page sent what an API client sends for the same conversation: same greedy answers
    client = openai_client(base)
    client.api_key = KEY
    history = [{"role": "system", "content": SYSTEM}]
    for m in conv["messages"]:
        if m["role"] == "user":
            history.append({"role": "user", "content": m["content"]})
            continue
        want = client.chat.completions.create(model="smollm2", messages=history, temperature=0,
                                              max_tokens=64).choices[0].message.content
        assert m["content"] == want
        history.append({"role": "assistant", "content": want})
    assert "Paris" in conv["messages"][1]["content"] and "Rome" in conv["messages"][3]["content"]

    # history survives a reload
    d.refresh()
    _wait(lambda: len(_js(d, "return document.querySelectorAll('.msg')")) == 4, 20, "the restored conversation")
    assert "Rome" in _answer_text(d)
    _no_foreign_requests(d, base)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    d.save_screenshot(str(ARTIFACTS / "chat-page.png"))
    errors = [e for e in d.get_log("browser") if e["level"] == "SEVERE"
              and "/v1/models - Failed to load resource: the server responded with a status of 401" not in e["message"]]
    assert not errors, errors  # (the 401 is the first load's, before the key was given)


def test_stop_ends_a_long_answer_and_the_server_cancels_it(browser, base):
    from selenium.webdriver.common.by import By

    d = browser
    _open_with_key(d, base)
    cancelled = httpx.get(base + "/health", timeout=10).json()["cancelled"]
    _settings(d, temperature=0.8, seed=7, **{"max-tokens": 4000})
    _send(d, "Write a very long story about a dragon who learns to bake bread. Make it at least 2000 words.")
    _wait(lambda: len(_answer_text(d)) > 20, 30, "the answer to start")
    d.find_element(By.ID, "stop").click()
    _wait(lambda: not _running(d), 10, "the page to stop")
    assert d.find_element(By.ID, "send").is_displayed() and not d.find_element(By.ID, "stop").is_displayed()
    stopped = _answer_text(d)
    stats = _js(d, "return document.querySelector('.msg.assistant:last-child .stats').textContent")
    assert "stopped" in stats, stats
    time.sleep(0.5)
    assert _answer_text(d) == stopped  # nothing arrives after the stop
    health = _wait(lambda: (lambda h: h if h["running"] == 0 and h["cancelled"] > cancelled else None)(
        httpx.get(base + "/health", timeout=10).json()), 10, "the server to cancel the request")
    assert health["waiting"] == 0
    stored = _stored(d)["conversations"][0]["messages"][-1]
    assert stored["stats"]["stopped"] and stored["content"] and len(stored["content"]) < 4000 * 4


HOSTILE = ("# Title\n\nSome **bold**, *italic*, `code <b>x</b>` and ~~gone~~.\n\n"
           "<img src=x onerror=\"window.pwned=1\"> <script>window.pwned=2</script>\n\n"
           "[bad](javascript:window.pwned=3) [good](https://example.com/a) <a href=x>raw</a>\n\n"
           "| a | b |\n|---|---|\n| 1 | <i>2</i> |\n\n"
           "- one\n- two\n  - nested\n\n1. first\n2. second\n\n"
           "```html\n<script>window.pwned=4</script>\n```\n")


def test_markdown_renders_and_model_html_stays_text(browser, base):
    d = browser
    d.get(base + "/")
    conv = {"id": "x1", "title": "<b>title</b>", "messages": [
        {"role": "user", "content": "<img src=x onerror=\"window.pwned=5\">"},
        {"role": "assistant", "content": "<think>plan <b>quietly</b></think>\n\n" + HOSTILE}]}
    _js(d, "localStorage.setItem('rase-chat', JSON.stringify(arguments[0]))",
        {"conversations": [conv], "current": "x1", "settings": {"apiKey": KEY}})
    d.refresh()
    _wait(lambda: len(_js(d, "return document.querySelectorAll('.msg')")) == 2, 20, "the stored conversation")
    time.sleep(0.3)
    box = "document.getElementById('messages')"
    assert _js(d, "return window.pwned") is None
    assert _js(d, f"return {box}.querySelectorAll('img, script, b, i, iframe').length") == 0
    assert _js(d, "return document.querySelectorAll('#conversations b').length") == 0
    text = _js(d, f"return {box}.textContent")
    assert '<img src=x onerror="window.pwned=5">' in text and "<script>window.pwned=2</script>" in text
    shape = _js(d, f"""const m = {box};
        return {{h1: m.querySelectorAll('h1').length, strong: m.querySelector('strong').textContent,
                 em: m.querySelector('em').textContent, del: m.querySelector('del').textContent,
                 links: [...m.querySelectorAll('a')].map(a => [a.textContent, a.href, a.rel]),
                 table: [...m.querySelectorAll('td')].map(c => c.textContent),
                 lists: [...m.querySelectorAll('ul li, ol li')].map(l => l.firstChild.textContent),
                 nested: m.querySelectorAll('ul ul li').length,
                 code: m.querySelector('pre code').textContent, lang: m.querySelector('.code-lang').textContent,
                 thinking: m.querySelector('details.thinking').textContent}};""")
    assert shape["h1"] == 1 and shape["strong"] == "bold" and shape["em"] == "italic" and shape["del"] == "gone"
    assert shape["links"] == [["good", "https://example.com/a", "noopener noreferrer nofollow"]]
    assert shape["table"] == ["1", "<i>2</i>"]
    assert shape["lists"][:2] == ["one", "two"] and shape["nested"] == 1 and "first" in shape["lists"]
    assert shape["code"] == "<script>window.pwned=4</script>" and shape["lang"] == "html"
    assert "plan <b>quietly</b>" in shape["thinking"]


@pytest.fixture(scope="module")
def vision_base(tmp_path_factory):
    import rase

    store = tmp_path_factory.mktemp("web-vision")
    vision = Path(__file__).resolve().parents[1] / "fixtures" / "vision"
    rase.import_model(str(store), str(vision / "gemma3-tiny.gguf"), "g3v", mmproj=str(vision / "gemma3-tiny-mmproj.gguf"))
    rase.import_model(str(store), str(vision / "gemma3-tiny.gguf"), "g3-text")
    with rase_serve(store, "--threads", "2") as url:
        yield url


def test_attach_an_image_for_a_model_that_reads_them(browser, vision_base, openai_client):
    """The page offers "Image" only for a model with a vision encoder; an attached image shows as a
    thumbnail, goes with the message as an image_url part, and the answer is the API's for the
    same parts (greedy)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    png = Path(__file__).resolve().parents[1] / "fixtures" / "vision" / "wide.png"
    d = browser
    d.get(vision_base + "/")
    _wait(lambda: d.find_element(By.ID, "model").get_attribute("value"), 20, "the model picker")
    Select(d.find_element(By.ID, "model")).select_by_value("g3-text")
    assert not d.find_element(By.ID, "attach-label").is_displayed()
    Select(d.find_element(By.ID, "model")).select_by_value("g3v")
    assert d.find_element(By.ID, "attach-label").is_displayed()
    _settings(d, temperature=0, **{"max-tokens": 8})
    d.find_element(By.ID, "attach").send_keys(str(png))
    _wait(lambda: _js(d, "return document.querySelectorAll('#attached img').length") == 1, 10, "the thumbnail")
    _send(d, "What is in this picture?")
    _wait(lambda: not _running(d) and _js(d, "return document.querySelectorAll('.msg.assistant').length") == 1,
          60, "the answer")
    assert _js(d, "return document.querySelectorAll('.msg.user img.thumb').length") == 1
    assert _js(d, "return document.querySelectorAll('#attached img').length") == 0  # sent with the message
    conv = _stored(d)["conversations"][0]
    user, answer = conv["messages"]
    assert user["images"][0].startswith("data:image/png;base64,")
    want = openai_client(vision_base).chat.completions.create(
        model="g3v", temperature=0, max_tokens=8,
        messages=[{"role": "user", "content": [{"type": "text", "text": "What is in this picture?"},
                                               {"type": "image_url", "image_url": {"url": user["images"][0]}}]}])
    assert answer["content"] == want.choices[0].message.content and answer["content"]
