"""rase/media/fetch.py: http(s) images only from public hosts, from the address that was checked;
and the server's --allow-image-urls."""
from __future__ import annotations

import base64
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from rase.errors import InvalidImage
from rase.media import fetch

PNG = (Path(__file__).resolve().parents[1] / "fixtures" / "vision" / "wide.png").read_bytes()


@pytest.mark.parametrize("ip, public", [
    ("8.8.8.8", True), ("2606:4700:4700::1111", True), ("127.0.0.1", False), ("::1", False),
    ("10.1.2.3", False), ("172.16.0.9", False), ("192.168.1.1", False), ("169.254.169.254", False),
    ("fe80::1", False), ("fc00::5", False), ("0.0.0.0", False), ("224.0.0.1", False), ("::ffff:127.0.0.1", False),
    ("::ffff:10.0.0.1", False), ("100.64.0.1", False)])
def test_only_public_addresses_are_fetched_from(ip, public):
    assert fetch.public_address(ip) is public


@pytest.mark.parametrize("url, match", [
    ("http://127.0.0.1:9/x.png", "inside the network"), ("http://localhost/x.png", "inside the network"),
    ("http://[::1]/x.png", "inside the network"), ("http://169.254.169.254/latest/meta-data", "inside the network"),
    ("ftp://example.com/x.png", "only http"), ("file:///etc/passwd", "only http"),
    ("http://user:pw@example.com/x.png", "credentials"),
])
def test_urls_inside_the_network_and_other_schemes_are_refused(url, match):
    with pytest.raises(InvalidImage, match=match):
        fetch.fetch_image_bytes(url)


def test_a_name_resolving_to_any_private_address_is_refused():
    mixed = lambda host, port, type=0: [(socket.AF_INET, type, 6, "", ("93.184.215.14", port)),  # noqa: E731
                                        (socket.AF_INET, type, 6, "", ("10.0.0.7", port))]
    with pytest.raises(InvalidImage, match="10.0.0.7"):
        fetch.resolve_public("rebind.example", 80, mixed)


class _Server:
    """A local HTTP server: what the fetch does once an address has passed the check."""

    def __init__(self, routes):
        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                status, body, headers = routes[self.path]
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


def test_the_fetch_itself_reads_the_image_bounded_and_follows_no_redirect(monkeypatch):
    srv = _Server({"/ok.png": (200, PNG, {}), "/moved": (302, b"", {"Location": "http://169.254.169.254/"}),
                   "/big": (200, b"x" * (fetch.MAX_BYTES + 1), {}), "/gone": (404, b"", {})})
    try:
        monkeypatch.setattr(fetch, "public_address", lambda ip: True)  # the address check is tested above
        base = f"http://images.test:{srv.port}"
        loop = lambda host, port, type=0: [(socket.AF_INET, type, 6, "", ("127.0.0.1", port))]  # noqa: E731
        assert fetch.fetch_image_bytes(base + "/ok.png", resolve=loop) == PNG
        with pytest.raises(InvalidImage, match="302.*redirects are not followed"):
            fetch.fetch_image_bytes(base + "/moved", resolve=loop)
        with pytest.raises(InvalidImage, match="over 10 MB"):
            fetch.fetch_image_bytes(base + "/big", resolve=loop)
        with pytest.raises(InvalidImage, match="404"):
            fetch.fetch_image_bytes(base + "/gone", resolve=loop)
    finally:
        srv.httpd.shutdown()
        srv.httpd.server_close()


def test_the_server_fetches_only_with_the_flag(tmp_path):
    import rase
    from tests.support.servers import rase_serve

    vision = Path(__file__).resolve().parents[1] / "fixtures" / "vision"
    rase.import_model(str(tmp_path), str(vision / "gemma3-tiny.gguf"), "v", mmproj=str(vision / "gemma3-tiny-mmproj.gguf"))
    srv = _Server({"/ok.png": (200, PNG, {})})
    body = {"model": "v", "max_tokens": 2, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": f"http://127.0.0.1:{srv.port}/ok.png"}}]}]}
    try:
        for args, match in (((), "--allow-image-urls"), (("--allow-image-urls",), "inside the network")):
            with rase_serve(tmp_path, *args) as base:
                r = httpx.post(base + "/v1/chat/completions", json=body, timeout=30)
                assert r.status_code == 400 and match in r.json()["error"]["message"], r.text
                data = {**body, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {
                    "url": "data:image/png;base64," + base64.b64encode(PNG).decode()}}]}]}
                assert httpx.post(base + "/v1/chat/completions", json=data, timeout=30).status_code == 200
    finally:
        srv.httpd.shutdown()
        srv.httpd.server_close()
