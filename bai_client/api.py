"""The manager's REST API over the standard library (``urllib``)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Client:
    def __init__(self, manager: str, token: str | None = None, timeout: float = 30) -> None:
        self.manager = manager.rstrip("/")
        self.token = token
        self.timeout = timeout

    def call(self, method: str, path: str, body: Any = None) -> Any:
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            headers["Content-Type"] = "application/json"
            data = json.dumps(body).encode()
        if self.token:
            headers["Authorization"] = f"Token {self.token}"
        request = urllib.request.Request(
            f"{self.manager}/api/v1/{path.lstrip('/')}", data=data, headers=headers, method=method
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:  # noqa: S310
                raw = response.read()
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                message = json.loads(raw).get("message") or f"HTTP {exc.code}"
            except (ValueError, AttributeError):
                message = f"HTTP {exc.code}"
            raise ApiError(exc.code, message) from None
        except urllib.error.URLError as exc:
            raise ApiError(0, f"cannot reach {self.manager}: {exc.reason}") from None
        return json.loads(raw) if raw else None
