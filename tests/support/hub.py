"""A model hub for tests: a real ThreadingHTTPServer on 127.0.0.1 serving repositories the way the
Hugging Face Hub's HTTP API serves them to huggingface_hub 0.36, recording every request it gets.

    GET  /api/models/{repo}[/revision/{rev}]    model info: id, sha (the commit), siblings (files)
    HEAD /{repo}/resolve/{rev}/{file}           X-Repo-Commit, ETag, Content-Length: what
                                                hf_hub_download checks before it downloads
    GET  /{repo}/resolve/{rev}/{file}           the bytes; `Range: bytes=N-` answers 206 with the rest

Errors carry the hub's X-Error-Code, which huggingface_hub turns into its typed errors: an unknown
repository, or a private one the token may not read, is 401 RepoNotFound (the hub does not say
which), a gated one 401 GatedRepo on its files without a token and 403 with a token not granted it
(its model info is public), an unknown revision 404 RevisionNotFound, an unknown file 404
EntryNotFound, and a token the hub does not know 401 "Invalid credentials in Authorization header"
on any request. `cut` makes the first GET of a file send its headers and that many bytes, then close
the connection.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    """Lower-case names."""

    @property
    def file(self) -> str | None:
        """The file a resolve request names, else None."""
        parts = self.path.split("/resolve/", 1)
        return parts[1].split("/", 1)[1] if len(parts) == 2 else None

    @property
    def revision(self) -> str | None:
        """The revision a resolve request names (a commit, branch or tag), else None."""
        parts = self.path.split("/resolve/", 1)
        return parts[1].split("/", 1)[0] if len(parts) == 2 else None


@dataclass
class Repo:
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)
    """commit -> its files (path -> bytes)."""
    refs: dict[str, str] = field(default_factory=dict)
    """Branch or tag -> commit."""
    gated: bool = False
    private: bool = False
    readers: set[str] = field(default_factory=set)
    """Tokens granted a gated or private repository."""

    def commit(self, revision: str) -> str | None:
        return revision if revision in self.commits else self.refs.get(revision)


@dataclass
class Hub:
    url: str = ""
    repos: dict[str, Repo] = field(default_factory=dict)
    tokens: set[str] = field(default_factory=set)
    """Tokens the hub knows."""
    cut: dict[str, int] = field(default_factory=dict)
    """File -> bytes sent before the connection is closed, on its first GET only."""
    seen: list[Seen] = field(default_factory=list)

    def push(self, repo_id: str, files: dict[str, bytes], *, branch: str = "main", tags: tuple[str, ...] = (),
             gated: bool = False, private: bool = False, readers: tuple[str, ...] = ()) -> str:
        """A commit of `files` on `branch` (created with the repo if new); returns its 40-hex id."""
        repo = self.repos.setdefault(repo_id, Repo(gated=gated, private=private, readers=set(readers)))
        digest = hashlib.sha1(repo.refs.get(branch, "").encode())
        for name in sorted(files):
            digest.update(name.encode() + b"\0" + hashlib.sha256(files[name]).digest())
        commit = digest.hexdigest()
        repo.commits[commit] = dict(files)
        repo.refs[branch] = commit
        for tag in tags:
            repo.refs[tag] = commit
        return commit

    def files_fetched(self, method: str = "GET") -> list[str]:
        return [s.file for s in self.seen if s.method == method and s.file is not None]

    def revisions_asked(self) -> list[str]:
        """The revision of each model-info request, in order ("main" when it names none)."""
        return [s.path.partition("/revision/")[2] or "main" for s in self.seen if s.path.startswith("/api/models/")]

    def revisions_fetched(self) -> set[str]:
        """Every revision a file request (GET or HEAD) named."""
        return {s.revision for s in self.seen if s.revision is not None}


def checkpoint_files(directory: Path) -> dict[str, bytes]:
    """Every file under a checkpoint directory, by its path relative to it (as a repo lists them)."""
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


@contextmanager
def hub_server() -> Iterator[Hub]:
    hub = Hub()
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args) -> None:  # quiet: the test reads `seen`
            pass

        def do_GET(self) -> None:
            self._answer(body=True)

        def do_HEAD(self) -> None:
            self._answer(body=False)

        def _answer(self, body: bool) -> None:
            path = unquote(urlsplit(self.path).path)
            with lock:
                hub.seen.append(Seen(self.command, path, {k.lower(): v for k, v in self.headers.items()}))
            if self._token() not in (None, *hub.tokens):
                return self._error(401, "", "Invalid credentials in Authorization header", body)
            if path.startswith("/api/models/"):
                return self._model_info(path.removeprefix("/api/models/"), body)
            owner, name, resolve, rest = (path.lstrip("/").split("/", 3) + ["", "", ""])[:4]
            if resolve != "resolve" or "/" not in rest:
                return self._error(404, "", "no such route", body)
            revision, file = rest.split("/", 1)
            self._file(f"{owner}/{name}", revision, file, body)

        def _token(self) -> str | None:
            scheme, _, token = self.headers.get("Authorization", "").partition(" ")
            return token if scheme == "Bearer" else None

        def _repo(self, repo_id: str, body: bool) -> Repo | None:
            repo = hub.repos.get(repo_id)
            if repo is None or repo.private and self._token() not in repo.readers:
                self._error(401, "RepoNotFound", "Repository not found", body)
                return None
            return repo

        def _model_info(self, rest: str, body: bool) -> None:
            repo_id, _, revision = rest.partition("/revision/")
            repo = self._repo(repo_id, body)
            if repo is None:
                return
            commit = repo.commit(revision or "main")
            if commit is None:
                return self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}", body)
            info = {"id": repo_id, "modelId": repo_id, "sha": commit, "private": repo.private,
                    "gated": "auto" if repo.gated else False, "disabled": False, "tags": [],
                    "siblings": [{"rfilename": name} for name in sorted(repo.commits[commit])]}
            self._send(200, {"Content-Type": "application/json"}, json.dumps(info).encode(), body)

        def _file(self, repo_id: str, revision: str, file: str, body: bool) -> None:
            repo = self._repo(repo_id, body)
            if repo is None:
                return
            if repo.gated and self._token() not in repo.readers:
                message = f"Access to model {repo_id} is restricted. You must have access to it and be authenticated."
                return self._error(401 if self._token() is None else 403, "GatedRepo", message, body)
            commit = repo.commit(revision)
            if commit is None:
                return self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}", body)
            data = repo.commits[commit].get(file)
            if data is None:
                return self._error(404, "EntryNotFound", f"{file} does not exist on {revision}", body,
                                   {"X-Repo-Commit": commit})
            headers = {"X-Repo-Commit": commit, "ETag": f'"{hashlib.sha256(data).hexdigest()}"',
                       "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
            start = 0
            ranged = self.headers.get("Range", "")
            if body and ranged.startswith("bytes=") and ranged.endswith("-"):
                start = int(ranged[len("bytes="):-1])
                headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
            with lock:
                cut = hub.cut.pop(file, None) if body else None
            if cut is not None:  # the headers promise the whole file; the connection ends after `cut` bytes
                self.send_response(200)
                for key, value in {**headers, "Content-Length": str(len(data))}.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data[:cut])
                self.wfile.flush()
                self.close_connection = True
                return
            self._send(206 if start else 200, headers, data[start:], body)

        def _error(self, status: int, code: str, message: str, body: bool, extra: dict | None = None) -> None:
            headers = {"Content-Type": "application/json", "X-Error-Message": message, **(extra or {})}
            if code:
                headers["X-Error-Code"] = code
            self._send(status, headers, json.dumps({"error": message}).encode(), body)

        def _send(self, status: int, headers: dict[str, str], data: bytes, body: bool) -> None:
            self.send_response(status)
            for key, value in {**headers, "Content-Length": str(len(data))}.items():
                self.send_header(key, value)
            self.end_headers()
            if body:
                self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, name="hub", daemon=True)
    thread.start()
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
