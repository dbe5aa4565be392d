"""The manager's REST API over the standard library (``urllib``)."""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.parse
import urllib.request
import uuid
from typing import IO, Any

# A session in one of these will never run again.
ENDED = frozenset({"TERMINATED", "ERROR", "CANCELLED"})
STREAM_BLOCK = 1024 * 1024


class ApiError(Exception):
    """The manager's refusal, in its words: ``message`` and, for bad input,
    every field's messages (``{"fields": {name: [message, ...]}}`` in ``extra``)."""

    def __init__(self, status: int, message: str, fields: dict[str, list[str]] | None = None):
        super().__init__(message)
        self.status = status
        self.fields = fields or {}

    def __str__(self) -> str:
        lines = [self.args[0]]
        for name, messages in self.fields.items():
            lines += [f"  {name}: {m}" for m in messages if f"{name}: {m}" != self.args[0]]
        return "\n".join(lines)


def _error(status: int, raw: bytes) -> ApiError:
    try:
        body = json.loads(raw)
        message = body.get("message") or f"HTTP {status}"
        fields = (body.get("extra") or {}).get("fields") or {}
    except (ValueError, AttributeError):
        message, fields = f"HTTP {status}", {}
    if not isinstance(fields, dict):
        fields = {}
    return ApiError(status, message, fields)


class Client:
    def __init__(self, manager: str, token: str | None = None, timeout: float = 30) -> None:
        self.manager = manager.rstrip("/")
        self.token = token
        self.timeout = timeout

    def call(
        self, method: str, path: str, body: Any = None, query: dict[str, str] | None = None
    ) -> Any:
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            headers["Content-Type"] = "application/json"
            data = json.dumps(body).encode()
        if self.token:
            headers["Authorization"] = f"Token {self.token}"
        url = f"{self.manager}/api/v1/{path.lstrip('/')}"
        if query:
            url += "?" + urllib.parse.urlencode(query)
        request = urllib.request.Request(url, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:  # noqa: S310
                raw = response.read()
        except urllib.error.HTTPError as exc:
            raise _error(exc.code, exc.read()) from None
        except urllib.error.URLError as exc:
            raise ApiError(0, f"cannot reach {self.manager}: {exc.reason}") from None
        return json.loads(raw) if raw else None

    def _connection(self) -> http.client.HTTPConnection:
        parts = urllib.parse.urlsplit(self.manager)
        kind = (
            http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        )
        # Large blocks: a file streams at disk speed, not 8 KiB at a time.
        return kind(parts.netloc, timeout=self.timeout, blocksize=STREAM_BLOCK)

    def _stream_request(
        self, method: str, path: str, query: dict[str, str], body: IO[bytes] | None, size: int = 0
    ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        headers = {"Authorization": f"Token {self.token}"} if self.token else {}
        if body is not None:
            headers.update(
                {"Content-Type": "application/octet-stream", "Content-Length": str(size)}
            )
        base = urllib.parse.urlsplit(self.manager).path.rstrip("/")
        url = f"{base}/api/v1/{path.lstrip('/')}?{urllib.parse.urlencode(query)}"
        conn = self._connection()
        try:
            conn.request(method, url, body=body, headers=headers)
            response = conn.getresponse()
        except OSError as exc:
            conn.close()
            raise ApiError(0, f"cannot reach {self.manager}: {exc}") from None
        if response.status >= 400:
            raw = response.read()
            conn.close()
            raise _error(response.status, raw)
        return conn, response

    def upload(self, path: str, query: dict[str, str], body: IO[bytes], size: int) -> Any:
        """PUT a file's bytes as they are read (never the whole file in memory)."""
        conn, response = self._stream_request("PUT", path, query, body, size)
        try:
            return json.loads(response.read())
        finally:
            conn.close()

    def download(self, path: str, query: dict[str, str], out: IO[bytes]) -> int:
        """GET a body into ``out`` as it arrives; returns the bytes written."""
        conn, response = self._stream_request("GET", path, query, None)
        try:
            written = 0
            while chunk := response.read(STREAM_BLOCK):
                out.write(chunk)
                written += len(chunk)
            return written
        finally:
            conn.close()

    def folder(self, ref: str) -> dict[str, Any]:
        """The folder ``ref`` names: an id, a name (yours first) or ``owner/name``."""
        folders = self.call("GET", "folders/")
        owner, _, name = ref.rpartition("/")
        for match in (
            lambda f: str(f["id"]) == ref,
            lambda f: (
                f["name"] == name
                and (f["owner"] == owner or not owner and f["permission"] == "owner")
            ),
            lambda f: f["name"] == name and not owner,
        ):
            found = [f for f in folders if match(f)]
            if found:
                return found[0]
        raise ApiError(404, f"You have no folder named {ref!r}.")

    def websocket_url(self, path: str) -> str:
        """``ws(s)://<manager>/ws/<path>``: the manager's websockets live beside its API."""
        scheme, rest = self.manager.split("://", 1)
        return f"{'wss' if scheme == 'https' else 'ws'}://{rest}/ws/{path.lstrip('/')}"

    def sessions(self, **query: str) -> list[dict[str, Any]]:
        data = self.call("GET", "sessions/", query=query)
        return data["results"] if isinstance(data, dict) else data

    def session_id(self, ref: str) -> str:
        """The id of the session ``ref`` names: an id, or the name of one of your
        sessions (the active one of that name, else the newest that ended)."""
        if _is_uuid(ref):
            return ref
        named = [s for s in self.sessions() if s["name"] == ref]
        active = [s for s in named if s["status"] not in ENDED]
        if not named:
            raise ApiError(404, f"You have no session named {ref!r}.")
        return (active or named)[0]["id"]

    def template_id(self, ref: str) -> int:
        """The id of the template ``ref`` names: an id, or the name of one you may use."""
        if ref.isdigit():
            return int(ref)
        named = [t for t in self.call("GET", "templates/") if t["name"] == ref]
        if not named:
            raise ApiError(404, f"There is no template named {ref!r} that you may use.")
        return named[0]["id"]


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True
