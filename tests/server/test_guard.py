"""Browser-origin attacks and the API key: DNS rebinding (Host), cross-site form posts and fetches
(Origin, Sec-Fetch-Site), opt-in CORS, the key's sources and its constant-time comparison, the
warning for a public bind without a key. Header-level checks through the app over a fake engine
(tests/support/fake_engine.py); the attacks themselves from a real headless Chromium against a real
`rase serve`."""
from __future__ import annotations

import http.server
import re
import subprocess
import threading
import time

import httpx
import pytest

from rase import InvalidRequest
from rase.server import create_app
from rase.server.guard import GuardConfig, serve_config
from tests.support.servers import rase_command, rase_serve
from tests.support.fake_engine import FakeEngine

KEY = "k3y-for-guard-tests"
LOCAL = "http://127.0.0.1:8080"


@pytest.fixture(scope="module")
def store(smollm2_store):
    return smollm2_store


@pytest.fixture(scope="module")
def engine(store):
    """The header-level checks route requests and never read an answer's content: a fake engine
    over the real store (the attacks below run against a real `rase serve`)."""
    return FakeEngine(store)


def _client(engine, **guard):
    from fastapi.testclient import TestClient

    return TestClient(create_app(engine, guard=GuardConfig.loopback(**guard)), base_url=LOCAL)


AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.mark.needs_model
def test_only_loopback_host_names_are_answered_on_a_loopback_bind(engine):
    c = _client(engine)
    for host in ("127.0.0.1:8080", "localhost:8080", "LOCALHOST", "[::1]:8080", "127.0.0.1"):
        assert c.get("/v1/models", headers={"host": host}).status_code == 200, host
    for host in ("rebind.example:8080", "127.0.0.1.evil.example", "evil.example", "", "[::1"):
        for method, path in (("GET", "/v1/models"), ("GET", "/"), ("POST", "/v1/completions"), ("GET", "/api/tags")):
            r = c.request(method, path, headers={"host": host}, json={"model": "smollm2", "prompt": "x"})
            assert r.status_code == 403 and "--allowed-host" in r.json()["error"]["message"], (host, path)
    proxied = _client(engine, allowed_hosts=GuardConfig.loopback().allowed_hosts + ("llm.internal",))
    assert proxied.get("/v1/models", headers={"host": "llm.internal"}).status_code == 200


CROSS = [{"origin": "https://evil.example"}, {"origin": "null"}, {"origin": "http://127.0.0.1:9999"},
         {"sec-fetch-site": "cross-site"}, {"sec-fetch-site": "same-site"},
         {"origin": "http://localhost:8080"}]  # another origin for the browser, though the same machine


@pytest.mark.needs_model
@pytest.mark.parametrize("headers", CROSS)
def test_cross_origin_requests_are_refused(engine, headers):
    c = _client(engine)
    form = {"content-type": "application/x-www-form-urlencoded", **headers}
    r = c.post("/v1/completions", content=b'{"model": "smollm2", "prompt": "x", "max_tokens": 1}', headers=form)
    assert r.status_code == 403 and "--cors-origin" in r.json()["error"]["message"]
    assert c.post("/tokenize", json={"content": "x"}, headers=headers).status_code == 403
    assert c.get("/v1/models", headers=headers).status_code == 403
    assert "access-control-allow-origin" not in {k.lower() for k in r.headers}


@pytest.mark.needs_model
def test_same_origin_and_non_browser_calls_pass(engine):
    c = _client(engine)
    assert c.post("/tokenize", json={"content": "x"}, headers={"origin": LOCAL}).status_code == 200
    assert c.post("/tokenize", json={"content": "x"}, headers={"sec-fetch-site": "same-origin"}).status_code == 200
    assert c.post("/tokenize", json={"content": "x"}).status_code == 200  # curl, SDKs: no Origin
    nav = {"sec-fetch-site": "cross-site", "sec-fetch-mode": "navigate"}  # a link to the page
    assert c.get("/", headers=nav).status_code == 200
    assert c.get("/v1/models", headers={"sec-fetch-site": "cross-site", "sec-fetch-mode": "cors"}).status_code == 403


@pytest.mark.needs_model
@pytest.mark.parametrize("ctype", [None, "application/x-www-form-urlencoded", "text/plain;charset=UTF-8"])
def test_a_json_body_is_read_as_json_whatever_type_curl_gave_it(engine, ctype):
    c = _client(engine)  # `curl -d '{...}'` says form-urlencoded; llama-server and Ollama read JSON anyway
    headers = {"content-type": ctype} if ctype else {}
    r = c.post("/tokenize", content=b'{"content": "Hello"}', headers=headers)
    assert r.status_code == 200 and r.json()["tokens"]
    body = b'{"model": "smollm2", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}'
    assert c.post("/v1/chat/completions", content=body, headers=headers).json()["usage"]["completion_tokens"] == 2
    # still refused from another site's page, whatever its type (the cross-site check comes first)
    assert c.post("/tokenize", content=b'{"content": "Hello"}', headers={**headers, "origin": "https://evil.example"}
                  ).status_code == 403
    assert c.post("/tokenize", content=b"content=Hello", headers=headers).status_code == 400  # not JSON: said so


@pytest.mark.needs_model
def test_cors_only_for_named_origins(engine):
    c = _client(engine, cors_origins=("https://app.example",))
    pre = c.options("/v1/chat/completions", headers={"origin": "https://app.example",
                                                     "access-control-request-method": "POST",
                                                     "access-control-request-headers": "authorization, content-type"})
    assert pre.status_code == 204 and pre.headers["access-control-allow-origin"] == "https://app.example"
    assert "Authorization" in pre.headers["access-control-allow-headers"]
    ok = c.post("/tokenize", json={"content": "x"}, headers={"origin": "https://app.example"})
    assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == "https://app.example"
    assert c.post("/tokenize", json={"content": "x"}, headers={"origin": "https://other.example"}).status_code == 403
    bad_pre = c.options("/v1/chat/completions", headers={"origin": "https://other.example",
                                                         "access-control-request-method": "POST"})
    assert bad_pre.status_code == 403 and "access-control-allow-origin" not in bad_pre.headers
    star = _client(engine, cors_origins=("*",))
    assert star.get("/v1/models", headers={"origin": "https://x.example"}).headers["access-control-allow-origin"] == "*"


@pytest.mark.needs_model
def test_api_key_is_compared_in_constant_time(engine, monkeypatch):
    import hmac

    seen = []
    real = hmac.compare_digest
    monkeypatch.setattr(hmac, "compare_digest", lambda a, b: seen.append((a, b)) or real(a, b))
    c = _client(engine, api_key=KEY)
    for given in ("", "Bearer", "Bearer k3y", f"Bearer {KEY}x", f"Basic {KEY}", f"Bearer {KEY[:-1]}Y"):
        assert c.get("/v1/models", headers={"authorization": given}).status_code == 401, given
    assert c.get("/v1/models", headers={"authorization": f"bearer {KEY}"}).status_code == 200
    assert (KEY.encode(), KEY.encode()) in [(b, a) for a, b in seen] and len(seen) >= 5
    for public in ("/", "/health", "/web/chat.js"):
        assert c.get(public).status_code == 200
    for private in ("/metrics", "/api/tags", "/openapi.json", "/v1/models/smollm2"):
        assert c.get(private).status_code == 401, private


def test_the_key_from_a_file_or_the_environment(tmp_path):
    f = tmp_path / "key"
    f.write_text("from-file\nignored second line\n")
    assert serve_config("127.0.0.1", api_key_file=str(f), environ={})[0].api_key == "from-file"
    assert serve_config("127.0.0.1", environ={"RASE_API_KEY": "from-env"})[0].api_key == "from-env"
    assert serve_config("127.0.0.1", "given", str(f), environ={"RASE_API_KEY": "e"})[0].api_key == "given"
    assert serve_config("127.0.0.1", None, str(f), environ={"RASE_API_KEY": "e"})[0].api_key == "from-file"
    assert serve_config("127.0.0.1", environ={})[0].api_key is None
    (tmp_path / "empty").write_text("\n")
    for bad in (tmp_path / "empty", tmp_path / "missing"):
        with pytest.raises(InvalidRequest, match="api-key-file"):
            serve_config("127.0.0.1", api_key_file=str(bad), environ={})
    public, warnings = serve_config("0.0.0.0", environ={})
    assert public.allowed_hosts is None and warnings and "without an API key" in warnings[0]
    assert serve_config("0.0.0.0", environ={"RASE_API_KEY": "k"})[1] == []
    assert serve_config("::1", environ={})[0].allowed_hosts == GuardConfig.loopback().allowed_hosts


@pytest.mark.needs_model
def test_a_public_bind_without_a_key_warns_and_the_env_key_holds(store):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([*rase_command(), "--store", str(store), "serve", "--host", "0.0.0.0",
                             "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline()
        assert "warning: serving on 0.0.0.0 without an API key" in line, line
    finally:
        proc.terminate()
        proc.communicate(timeout=10)
    with rase_serve(store, env={"RASE_API_KEY": KEY}) as base:
        assert httpx.get(base + "/v1/models", timeout=10).status_code == 401
        assert httpx.get(base + "/v1/models", headers=AUTH, timeout=10).status_code == 200


def _refused(base: str) -> int:
    text = httpx.get(base + "/metrics", headers=AUTH, timeout=10).text
    return sum(float(v) for v in re.findall(r'rase_http_requests_total\{[^}]*status="403"[^}]*\} (\S+)', text))


@pytest.fixture
def attacker(tmp_path):
    """Another origin on this machine: a plain HTTP server for an attack page (written per test)."""
    handler = lambda *a, **kw: http.server.SimpleHTTPRequestHandler(*a, directory=str(tmp_path), **kw)
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield tmp_path, f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


@pytest.fixture(scope="module")
def served(store):
    with rase_serve(store, "--api-key", KEY) as base:
        yield base


ATTACK = """<!doctype html><title>start</title>
<form id="f" method="POST" action="{rase}/v1/completions" enctype="text/plain">
<input name='{{"model": "smollm2", "prompt": "pwned", "max_tokens": 4, "pad": "' value='"}}'></form>
<script>
fetch("{rase}/v1/completions", {{method: "POST", mode: "no-cors", headers: {{"Content-Type": "text/plain"}},
      body: JSON.stringify({{model: "smollm2", prompt: "pwned", max_tokens: 4}})}})
  .finally(() => {{ document.title = "fetched"; document.getElementById("f").submit(); }});
</script>"""


@pytest.mark.needs_model
def test_a_hostile_page_cannot_drive_the_api(browser, served, attacker):
    root, origin = attacker
    before, generated = _refused(served), httpx.get(served + "/health").json()["requests"]
    (root / "attack.html").write_text(ATTACK.format(rase=served))
    browser.get(origin + "/attack.html")
    deadline = time.monotonic() + 20
    while _refused(served) < before + 2 and time.monotonic() < deadline:  # the fetch and the form post
        time.sleep(0.1)
    assert _refused(served) >= before + 2
    assert httpx.get(served + "/health").json()["requests"] == generated  # nothing generated
    assert "cross-origin request refused" in browser.page_source  # the form post's answer


@pytest.mark.needs_model
@pytest.mark.chromium_args("--host-resolver-rules=MAP rebind.test 127.0.0.1")
def test_dns_rebinding_is_refused(browser, served):
    port = served.rsplit(":", 1)[1]
    before = _refused(served)
    browser.get(f"http://rebind.test:{port}/health")  # a name that now resolves to loopback
    assert "Host header not allowed" in browser.page_source
    browser.get(f"http://rebind.test:{port}/")
    assert "Host header not allowed" in browser.page_source
    assert _refused(served) >= before + 2  # (and the browser's favicon requests)
    browser.get(served + "/health")
    assert '"status":"ok"' in browser.page_source.replace(" ", "")
