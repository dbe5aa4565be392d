"""Health checks of replicas, through the apps proxy's tunnel to the agent.

The reconciler cannot take an agent's tunnel itself (a tunnel dials back the apps
proxy process that asked for it), so it asks the apps proxy: ``GET
<BAI_SERVE_PROBE_URL>/_bai/probe?t=<signed>``, where the signed, short-lived token
names the agent, kernel, port and path. The proxy opens a tunnel, sends one GET and
answers ``{"ok", "status", "reason"}`` (``proxy_app/probe.py``).
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from django.conf import settings
from django.core import signing

logger = logging.getLogger(__name__)

PROBE_SALT = "bai.serve.probe"
PROBE_TOKEN_TTL = 60
MAX_PARALLEL = 16


@dataclass(frozen=True)
class Probe:
    route_id: int
    agent_id: str
    kernel_id: str
    port: int
    path: str


@dataclass(frozen=True)
class Result:
    ok: bool | None  # None: the check itself could not run (the apps proxy did not answer)
    reason: str
    status: int | None = None


def probe_base() -> str:
    base = getattr(settings, "BAI_SERVE_PROBE_URL", "") or settings.BAI_APPS_TUNNEL_URL
    scheme, sep, rest = base.partition("://")
    scheme = {"ws": "http", "wss": "https"}.get(scheme, scheme)
    return f"{scheme}{sep}{rest}".rstrip("/")


def probe_token(probe: Probe) -> str:
    return signing.dumps(
        {"a": probe.agent_id, "k": probe.kernel_id, "p": probe.port, "h": probe.path},
        salt=PROBE_SALT,
    )


def read_probe_token(token: str) -> dict | None:
    """The probe a token names, if it is ours and fresh (the apps proxy's side)."""
    try:
        data = signing.loads(token, salt=PROBE_SALT, max_age=PROBE_TOKEN_TTL)
    except signing.BadSignature:
        return None
    if not isinstance(data, dict) or not all(k in data for k in ("a", "k", "p", "h")):
        return None
    return data


def check(probe: Probe, timeout: float | None = None) -> Result:
    timeout = float(timeout or settings.BAI_SERVE_HEALTH_TIMEOUT)
    url = f"{probe_base()}/_bai/probe?" + urllib.parse.urlencode(
        {"t": probe_token(probe), "timeout": timeout}
    )
    try:
        # The proxy needs the timeout itself plus the tunnel's set-up.
        with urllib.request.urlopen(url, timeout=timeout + 3) as response:  # noqa: S310
            answer = json.loads(response.read(4096))
    except urllib.error.HTTPError as exc:
        return Result(None, f"the apps proxy refused the health check ({exc.code})")
    except (OSError, ValueError) as exc:
        return Result(None, f"the apps proxy at {probe_base()} did not answer ({exc})")
    status = answer.get("status")
    return Result(bool(answer.get("ok")), str(answer.get("reason") or "")[:300], status)


def check_all(probes: list[Probe]) -> dict[int, Result]:
    """Every probe at once (bounded threads): route id → result."""
    if not probes:
        return {}
    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(probes))) as pool:
        results = list(pool.map(check, probes))
    return {p.route_id: r for p, r in zip(probes, results, strict=True)}
