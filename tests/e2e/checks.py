"""Checks that every e2e test applies to the pages it drives.

- ``OwnOriginGuard``: records every request (HTTP or websocket) a page makes to
  anything but the project's own origin. ``conftest.py`` attaches one to every
  browser context the tests create and fails the test if it saw one.
- ``assert_accessible(page)``: runs axe-core (from npm, served by the project
  at ``AXE_URL``) on the page and fails on a serious or critical violation.
  ``Shots`` calls it after every screenshot, so every page a test looks at is
  checked; a test may call it directly on a state it does not screenshot.
- ``png_rows``: the pixels of a PNG screenshot, for tests that must see that
  something is drawn (no image library is needed for that).
"""

from __future__ import annotations

import re
import struct
import zlib
from pathlib import Path
from urllib.parse import urlsplit

AXE_URL = "/static/vendor/axe-core/axe.min.js"
AXE_FILE = Path(__file__).resolve().parents[2] / "node_modules" / "axe-core" / "axe.min.js"
BLOCKING_IMPACTS = ("serious", "critical")
NETWORK_SCHEMES = ("http", "https", "ws", "wss")

# Regions of pages that the project does not write and cannot fix, left out of
# the accessibility check. Each entry says why.
THIRD_PARTY_REGIONS: tuple[str, ...] = (
    # /api/docs/: what Swagger UI (drf-spectacular-sidecar) renders into our page.
    # Its markup nests controls in controls (each operation's summary is a button
    # holding links and buttons) and its stylesheet draws the version badges and
    # the "Authorize" button below the contrast minimum; neither changes without
    # forking Swagger UI. The page around it (language, landmark) is ours and checked.
    "#swagger-ui",
    # Django admin's two-list picker (filter_horizontal, built by its SelectFilter2.js)
    # puts an aria-label on a decorative <span> without a role; the lists, inputs
    # and buttons of the widget are still checked.
    ".selector .help-tooltip",
)


class OwnOriginGuard:
    """Every URL outside ``origin`` (scheme and host:port of the live server)
    that a watched browser context requested; data: and blob: URLs stay local."""

    def __init__(self, origin: str) -> None:
        self.netloc = urlsplit(origin).netloc
        self.foreign: list[str] = []
        self.apps_host: re.Pattern[str] | None = None

    def allow_apps(self, origin: str) -> None:
        """Also allow the live apps proxy's per-app origins
        (``<session hex>-<app>.apps.localhost:<port>`` for ``origin``
        ``http://apps.localhost:<port>``) and its bare host, where the inference router
        serves ``/serve/<endpoint>/``; nothing else."""
        netloc = re.escape(urlsplit(origin).netloc)
        self.apps_host = re.compile(rf"(?:[0-9a-f]{{32}}-[a-z][a-z0-9-]*\.)?{netloc}")

    def is_foreign(self, url: str) -> bool:
        parts = urlsplit(url)
        if parts.scheme not in NETWORK_SCHEMES or parts.netloc == self.netloc:
            return False
        return not (self.apps_host and self.apps_host.fullmatch(parts.netloc))

    def see(self, url: str) -> None:
        if self.is_foreign(url):
            self.foreign.append(url)

    def watch(self, context) -> None:
        """Record the requests of every page of ``context``, websockets included
        (they raise no ``request`` event)."""
        context.on("request", lambda request: self.see(request.url))
        context.on("page", lambda page: page.on("websocket", lambda ws: self.see(ws.url)))

    def assert_clean(self) -> None:
        assert not self.foreign, (
            f"pages requested URLs outside the project's own origin ({self.netloc}): "
            + ", ".join(self.foreign[:20])
        )


class GuardedBrowser:
    """A Playwright browser whose every context is watched by ``guard``."""

    def __init__(self, browser, guard: OwnOriginGuard) -> None:
        self._browser = browser
        self.guard = guard

    def new_context(self, **kwargs):
        context = self._browser.new_context(**kwargs)
        self.guard.watch(context)
        return context

    def new_page(self, **kwargs):
        return self.new_context(**kwargs).new_page()

    def __getattr__(self, name: str):
        return getattr(self._browser, name)


_RUN_AXE = """async (exclude) => {
  const context = exclude.length ? { exclude: exclude.map((selector) => [selector]) } : document;
  const result = await window.axe.run(context, { resultTypes: ["violations"] });
  return result.violations.map((v) => ({
    id: v.id,
    impact: v.impact,
    help: v.help,
    nodes: v.nodes.slice(0, 6).map((n) => ({ target: n.target.join(" "), summary: n.failureSummary })),
  }));
}"""


def axe_violations(page, *, exclude: tuple[str, ...] | list[str] = ()) -> list[dict]:
    """axe-core's violations on the page as it is now (every impact)."""
    if not page.evaluate("() => typeof window.axe === 'object'"):
        if page.url.startswith(("http://127.0.0.1:", "http://localhost:")):
            page.add_script_tag(url=AXE_URL)
        else:
            # A page of the apps origin (an app's, not the manager's) has no /static/ of ours.
            page.add_script_tag(path=str(AXE_FILE))
    return page.evaluate(_RUN_AXE, [*THIRD_PARTY_REGIONS, *exclude])


def assert_accessible(page, *, exclude: tuple[str, ...] | list[str] = (), where: str = "") -> None:
    """Fail on any serious or critical axe-core violation on the page.

    ``exclude``: CSS selectors of third-party regions to leave out; say why
    beside the call.
    """
    blocking = [v for v in axe_violations(page, exclude=exclude) if v["impact"] in BLOCKING_IMPACTS]
    if blocking:
        lines = [f"accessibility violations on {where or page.url}:"]
        for v in blocking:
            lines.append(f"- {v['impact']} {v['id']}: {v['help']}")
            for node in v["nodes"]:
                lines.append(f"    {node['target']}: {node['summary']}".replace("\n", " / "))
        raise AssertionError("\n".join(lines))


def png_rows(data: bytes) -> list[list[tuple[int, int, int]]]:
    """The RGB pixels of an 8-bit, non-interlaced RGB or RGBA PNG (what
    Chromium's screenshots are), row by row."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat = 8, b""
    width = height = channels = 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and interlace == 0 and color in (2, 6), (depth, color, interlace)
            channels = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += body
    raw = zlib.decompress(idat)
    stride = width * channels
    rows: list[list[tuple[int, int, int]]] = []
    previous = bytearray(stride)
    at = 0
    for _ in range(height):
        kind, line = raw[at], bytearray(raw[at + 1 : at + 1 + stride])
        at += 1 + stride
        for x in range(stride):
            left = line[x - channels] if x >= channels else 0
            up = previous[x]
            corner = previous[x - channels] if x >= channels else 0
            if kind == 1:
                line[x] = (line[x] + left) & 255
            elif kind == 2:
                line[x] = (line[x] + up) & 255
            elif kind == 3:
                line[x] = (line[x] + (left + up) // 2) & 255
            elif kind == 4:
                guess = left + up - corner
                pa, pb, pc = abs(guess - left), abs(guess - up), abs(guess - corner)
                best = left if pa <= pb and pa <= pc else up if pb <= pc else corner
                line[x] = (line[x] + best) & 255
        rows.append([tuple(line[x : x + 3]) for x in range(0, stride, channels)])
        previous = line
    return rows
