"""A stand-in Hugging Face hub on 127.0.0.1, for ``huggingface_hub`` itself to talk to.

It serves what ``huggingface_hub`` asks for: ``GET /api/models/{repo}[/revision/{rev}]``
(model info with ``siblings``), ``HEAD``/``GET /{repo}/resolve/{rev}/{file}`` with
``X-Repo-Commit``/``ETag``/``Content-Length``, and ``Range`` requests. It answers with the
hub's ``X-Error-Code`` headers for missing repos, revisions, files and gated repos. Each
repo has one commit, ``SHA``, that ``main`` (and ``SHA`` itself) name. Tests fill an HF
cache through it with ``huggingface_hub``'s own downloads, so the cache is laid out
exactly as ``huggingface_hub`` lays it out.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

__all__ = ["SHA", "FakeHub", "Repo", "serve_fake_hub"]

SHA = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class Repo:
    files: dict[str, bytes]
    status: int | None = None
    """Answer every request on this repo with this status (401, 403)."""
    gated: bool = False
    """Model info is public, files answer 403 GatedRepo (as the hub does)."""


@dataclass
class FakeHub:
    repos: dict[str, Repo] = field(default_factory=dict)
    requests: list[tuple[str, str, str | None, str | None]] = field(default_factory=list)
    """(method, path, range, authorization) of every request received."""
    sent: dict[str, int] = field(default_factory=dict)
    """Body bytes sent per path."""
    endpoint: str = ""


class _Handler(BaseHTTPRequestHandler):
    hub: FakeHub

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_HEAD(self) -> None:
        self._answer(head=True)

    def do_GET(self) -> None:
        self._answer(head=False)

    def _answer(self, *, head: bool) -> None:
        hub = self.hub
        path = self.path.split("?", 1)[0]
        hub.requests.append(
            (self.command, path, self.headers.get("Range"), self.headers.get("Authorization"))
        )
        if m := re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?", path):
            self._model_info(m.group(1), m.group(2) or "main", head=head)
        elif m := re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path):
            self._resolve(m.group(1), m.group(2), m.group(3), head=head)
        else:
            self._send(404, b"", head=head)

    def _repo(self, repo_id: str, rev: str, *, head: bool, files: bool) -> Repo | None:
        repo = self.hub.repos.get(repo_id)
        if repo is None:
            self._send(
                404, b'{"error":"Repository not found"}', head, {"X-Error-Code": "RepoNotFound"}
            )
        elif repo.status is not None:
            self._send(repo.status, b'{"error":"Invalid username or password."}', head)
        elif repo.gated and files:
            self._send(403, b'{"error":"gated"}', head, {"X-Error-Code": "GatedRepo"})
        elif rev not in ("main", SHA):
            self._send(404, b"{}", head, {"X-Error-Code": "RevisionNotFound"})
        else:
            return repo
        return None

    def _model_info(self, repo_id: str, rev: str, *, head: bool) -> None:
        if (repo := self._repo(repo_id, rev, head=head, files=False)) is None:
            return
        siblings = [{"rfilename": name} for name in sorted(repo.files)]
        body = json.dumps({"id": repo_id, "sha": SHA, "siblings": siblings}).encode()
        self._send(200, body, head, {"Content-Type": "application/json"})

    def _resolve(self, repo_id: str, rev: str, filename: str, *, head: bool) -> None:
        if (repo := self._repo(repo_id, rev, head=head, files=True)) is None:
            return
        data = repo.files.get(filename)
        if data is None:
            headers = {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": SHA}
            self._send(404, b"{}", head, headers)
            return
        headers = {"X-Repo-Commit": SHA, "ETag": f'"{hashlib.sha256(data).hexdigest()}"'}
        status, body = 200, data
        if (wanted := self.headers.get("Range")) and (
            m := re.fullmatch(r"bytes=(\d+)-(\d+)", wanted)
        ):
            start, end = int(m.group(1)), min(int(m.group(2)), len(data) - 1)
            status, body = 206, data[start : end + 1]
            headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
        self._send(status, body, head, headers)

    def _send(
        self, status: int, body: bytes, head: bool, headers: dict[str, str] | None = None
    ) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)
            path = self.path.split("?", 1)[0]
            self.hub.sent[path] = self.hub.sent.get(path, 0) + len(body)


@contextmanager
def serve_fake_hub() -> Iterator[FakeHub]:
    """A running stand-in hub; ``FakeHub.endpoint`` is its URL."""
    state = FakeHub()
    handler = type("Handler", (_Handler,), {"hub": state})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    state.endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
