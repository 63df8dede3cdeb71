"""A local HTTP server that answers the Hugging Face Hub's file routes, for pull tests:
HEAD/GET /{repo}/resolve/{revision}/{filename} with the headers huggingface_hub reads."""
from __future__ import annotations

import hashlib
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class FakeHub:
    def __init__(self, files: dict[tuple[str, str], bytes]) -> None:
        self.files = files  # (repo, filename) -> content
        self.requests: list[tuple[str, str]] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # keep test output clean
                pass

            def _serve(self, body: bool) -> None:
                hub.requests.append((self.command, self.path))
                parts = self.path.split("?")[0].strip("/").split("/")
                if "resolve" not in parts:
                    self.send_error(404)
                    return
                i = parts.index("resolve")
                repo, filename = "/".join(parts[:i]), "/".join(parts[i + 2:])
                data = hub.files.get((repo, filename))
                if data is None:
                    self.send_response(404)
                    self.send_header("X-Error-Code", "EntryNotFound")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
                self.send_header("X-Repo-Commit", COMMIT)
                self.send_header("Content-Length", str(len(data)))
                self.send_header("Content-Type", "application/octet-stream")
                self.end_headers()
                if body:
                    self.wfile.write(data)

            def do_HEAD(self) -> None:
                self._serve(False)

            def do_GET(self) -> None:
                self._serve(True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "FakeHub":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
