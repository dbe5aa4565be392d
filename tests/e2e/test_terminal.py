"""The web terminal in Chromium at 1x pixel density, against a real agent:
every character is drawn (underscores too, at every text size offered),
selecting text copies it, and the text size control refits the terminal and
is remembered.

Persona: ``alice`` with one running interactive session (the busybox image).
Screenshots go to test-artifacts/e2e/<test>/<step>.png.
"""

from __future__ import annotations

import time

import pytest

from tests.e2e.checks import png_rows

pytestmark = [pytest.mark.e2e, pytest.mark.docker, pytest.mark.django_db(transaction=True)]

LINE = "BACKENDAI_CLUSTER_HOST=main1"
UNDERSCORES = [i for i, c in enumerate(LINE) if c == "_"]
SIZES = [10, 11, 12, 13, 14, 15, 16, 18, 20, 22, 24]  # static/js/terminal.js FONT_SIZES

# Where a line of the terminal is on the page: its row in the viewport, the box
# of one cell, and the text the DOM renderer put in that row.
FIND_LINE = """(text) => {
  const buffer = term.buffer.active;
  const screen = document.querySelector(".xterm-screen").getBoundingClientRect();
  const rows = document.querySelectorAll(".xterm-rows > div");
  for (let y = term.rows - 1; y >= 0; y--) {
    const line = buffer.getLine(buffer.viewportY + y);
    if (line && line.translateToString(true) === text) {
      const box = rows[y].getBoundingClientRect();
      return { x: screen.left, y: box.top, width: screen.width / term.cols, height: box.height,
               dom: rows[y].textContent.trimEnd() };
    }
  }
  return null;
}"""


@pytest.fixture
def running(real_agent, users, images):
    """alice's interactive session, RUNNING on the real agent (made before the
    browser starts: afterwards Playwright's loop makes this thread async)."""
    from sessions_app import services
    from sessions_app.models import Session

    session = services.session_create(
        owner=users["alice"],
        spec={
            "image": "bai-kernel/minimal:1",
            "name": "shell",
            "resources": {"cpu": "0.5", "mem": "256m"},
        },
    )
    deadline = time.monotonic() + 90
    while (status := Session.objects.get(pk=session.pk).status) != "RUNNING":
        assert time.monotonic() < deadline, f"the session is still {status}"
        time.sleep(0.2)
    return session


def _terminal(login, live_server_url, session, **context):
    page = login("alice", screenshot=False, device_scale_factor=1, **context)
    page.goto(f"{live_server_url}/sessions/{session.pk}/terminal/")
    page.wait_for_function("() => window.termReady === true")
    page.locator("#terminal").click()
    return page


def _echo_line(page):
    page.keyboard.type("echo BACKENDAI_CLUSTER_HOST=$BACKENDAI_CLUSTER_HOST\n")
    page.wait_for_function(f"() => window.termOutput.includes('{LINE}\\r\\n')")
    # xterm draws the rows on a later animation frame than the data arrives.
    _wait_drawn(page)


def _wait_drawn(page):
    """Until the DOM renderer has drawn LINE (xterm draws a later frame than
    the data, or a resize, arrives)."""
    page.wait_for_function(
        f"(text) => {{ const c = ({FIND_LINE})(text); return c !== null && c.dom === text; }}",
        arg=LINE,
    )


def _lit(page, cell, column) -> int:
    """How many pixels of one cell are drawn in a light colour (the background is dark)."""
    clip = {
        "x": cell["x"] + column * cell["width"],
        "y": cell["y"],
        "width": cell["width"],
        "height": cell["height"],
    }
    return sum(
        1 for row in png_rows(page.screenshot(clip=clip)) for r, g, b in row if r + g + b > 300
    )


def _set_size(page, size):
    page.evaluate(
        """(size) => {
          const smaller = document.getElementById("term-smaller");
          const larger = document.getElementById("term-larger");
          while (term.options.fontSize > size && !smaller.disabled) smaller.click();
          while (term.options.fontSize < size && !larger.disabled) larger.click();
        }""",
        size,
    )
    assert page.evaluate("term.options.fontSize") == size
    # The DOM renderer redraws on the next frame: wait for two, and the line.
    page.evaluate("() => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)))")
    _wait_drawn(page)


def test_underscores_are_drawn_at_1x_pixel_density_at_every_text_size(
    running, live_server_url, login, shot
):
    page = _terminal(login, live_server_url, running)
    assert page.evaluate("window.devicePixelRatio") == 1
    _echo_line(page)
    cell = page.evaluate(FIND_LINE, LINE)
    assert cell is not None and cell["dom"] == LINE, cell
    shot(page, "terminal-underscores-14px")

    for size in SIZES:
        _set_size(page, size)
        cell = page.evaluate(FIND_LINE, LINE)
        assert cell["dom"] == LINE, (size, cell)
        drawn = {column: _lit(page, cell, column) for column in UNDERSCORES}
        assert all(drawn.values()), f"{size}px: underscore cells without a drawn pixel: {drawn}"
        # A blank cell right of the text stays dark: the check can tell.
        assert _lit(page, cell, len(LINE) + 2) == 0, size
    shot(page, "terminal-underscores-24px")


def test_selecting_text_in_the_terminal_copies_it_to_the_clipboard(
    running, live_server_url, login, shot
):
    page = _terminal(login, live_server_url, running)
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=live_server_url)
    _echo_line(page)
    cell = page.evaluate(FIND_LINE, LINE)
    # A double click selects the word under the pointer: here, the whole line.
    page.mouse.dblclick(cell["x"] + 3.5 * cell["width"], cell["y"] + cell["height"] / 2)
    page.wait_for_function("() => window.termCopied !== null")
    assert page.evaluate("window.termCopied") == LINE
    assert page.evaluate("() => navigator.clipboard.readText()") == LINE
    assert page.inner_text("#term-note") == f"Copied {len(LINE)} characters"
    shot(page, "terminal-copied-on-select")


def test_the_text_size_control_refits_the_terminal_and_is_remembered(
    running, live_server_url, login, shot
):
    page = _terminal(login, live_server_url, running)
    assert page.inner_text("#term-size") == "14 px"
    cols = page.evaluate("term.cols")
    page.click("#term-larger")
    page.click("#term-larger")
    page.wait_for_function(f"() => term.options.fontSize === 16 && term.cols < {cols}")
    assert page.inner_text("#term-size") == "16 px"
    assert page.evaluate("localStorage.getItem('bai.term.fontSize')") == "16"

    # The shell was told the new size.
    page.locator("#terminal").click()
    page.keyboard.type("stty size\n")
    rows, cols = page.evaluate("[term.rows, term.cols]")
    page.wait_for_function(f"() => window.termOutput.includes('\\n{rows} {cols}\\r')")
    shot(page, "terminal-16px")

    page.reload()
    page.wait_for_function("() => window.termReady === true")
    assert page.evaluate("term.options.fontSize") == 16
    assert page.inner_text("#term-size") == "16 px"

    for _ in range(10):
        if page.is_disabled("#term-smaller"):
            break
        page.click("#term-smaller")
    assert page.inner_text("#term-size") == "10 px"
    assert page.is_enabled("#term-larger")
    shot(page, "terminal-smallest")
