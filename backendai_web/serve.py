"""``python -m backendai_web.serve -b HOST -p PORT backendai_web.asgi:application``:
daphne (any of its arguments), with websocket message limits that fit what the
manager accepts.

daphne refuses an incoming websocket message over 1 MiB by closing the socket: an
agent's code-run answer (a frame carries up to 1 MiB of output, escaped), a kept log
tail past ~170 KiB, or a browser's code of more than 1 MiB would each end the
connection they came on (an agent's with all its kernels' streams). The limit given
here is the largest frame the gateway checks (``protocol.max_frame_chars``) or a code
run's request (``BAI_EXEC_MAX_CODE``, escaped), whichever is larger; the consumers
bound every message themselves.
"""

from __future__ import annotations

import os
import sys


def code_run_limit() -> int:
    """The largest code-run request that can be valid: code of ``BAI_EXEC_MAX_CODE``
    bytes and a batch's two commands, JSON escaping a byte as up to 6 characters."""
    from django.conf import settings

    from agent import protocol

    return 6 * (settings.BAI_EXEC_MAX_CODE + 2 * protocol.EXEC_COMMAND_MAX) + 4096


def websocket_limit() -> int:
    from django.conf import settings

    from agent import protocol

    return max(protocol.max_frame_chars(settings.BAI_LOG_TAIL_BYTES), code_run_limit())


def main(argv: list[str] | None = None) -> None:
    from daphne.cli import CommandLineInterface

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "backendai_web.settings")
    limit = str(websocket_limit())
    sizes = ["--websocket-max-message-size", limit, "--websocket-max-frame-size", limit]
    CommandLineInterface().run([*sizes, *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    main()
