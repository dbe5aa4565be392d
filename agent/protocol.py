"""The wire contract between the manager and its agents.

Imports nothing from Django: both ``agent/`` (the node daemon) and the manager's
gateway consumer import this module, and nothing else of each other.

Transport: one websocket per agent at ``/ws/agent/``. Every frame is a JSON
object with a ``type`` key (one of the constants below) and the fields listed
beside it. Commands are idempotent and keyed by kernel id (or terminal id), so
a lost or repeated message is harmless: the heartbeat path re-sends whatever
the fast path missed.

Resource slots travel as ``{"cpu": "2", "mem": "1073741824", "cuda.device": "1"}``:
slot name to a decimal *string* (exact arithmetic; ``mem`` is in bytes).

Agents are untrusted peers: the manager decodes every agent frame with
:func:`decode_frame` and checks it with :func:`validate` against ``AGENT_MESSAGES``,
the bounds of every field of every agent -> manager message (below). A frame that
fails either is answered with an ``error`` and changes nothing. The agent trims its
free-text fields to these bounds before it sends (:func:`fit`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

PROTOCOL_VERSION = 1

# The uid and gid that kernels write data folders as (the Docker backend's kernel
# user). The manager creates a folder owned by them, mode 2770: never world-writable.
KERNEL_UID = 1000
KERNEL_GID = 1000

# Close codes of the agent websocket.
CLOSE_BAD_TOKEN = 4401  # unknown or revoked token: the agent must not retry with it
CLOSE_PROTOCOL = 4400  # malformed frame or unsupported protocol version
CLOSE_REPLACED = 4409  # another connection with the same token took over

# --- agent -> manager -------------------------------------------------------
# {"type": "register", "protocol": 1, "hostname": str, "backend": "docker"|"process",
#  "resource_group": str|None, "slots": {slot: str}, "labels": {str: str},
#  "version": str, "kernels": [KernelReport, ...]}
REGISTER = "register"
# {"type": "heartbeat", "kernels": [KernelReport, ...], "slots": {slot: str}|None}
HEARTBEAT = "heartbeat"
# {"type": "kernel_status", **KernelReport}: sent the moment a kernel changes.
KERNEL_STATUS = "kernel_status"
# {"type": "log_chunk", "kernel_id": str, "stream_id": str, "data": str}
#   live output of a followed kernel log (stream_id is the one of logs_follow). The
#   manager takes chunks only for streams it asked this agent to follow, of that kernel.
LOG_CHUNK = "log_chunk"
# {"type": "log_tail", "kernel_id": str, "data": str}
#   the kept tail (log_tail_bytes of "registered") of a kernel that ended; sent once
#   per end, and again on request (idempotent on the manager).
LOG_TAIL = "log_tail"
# {"type": "term_output", "term_id": str, "data": str}  (utf-8 text, lossy decode)
#   taken only for terminals the manager opened or addressed on this agent.
TERM_OUTPUT = "term_output"
# {"type": "term_closed", "term_id": str, "reason": str}
TERM_CLOSED = "term_closed"
# {"type": "exec_records", "req_id": str, "run_id": str, "records": [Record, ...]}
#   more output of a run, sent as it comes to an exec with "stream": true.
EXEC_RECORDS = "exec_records"
# {"type": "exec_result", "req_id": str, "run_id": str, "status": one of EXEC_STATUSES,
#  "exit_code": int|None, "records": [Record, ...], "completions": [str, ...]|None,
#  "reason": str|None, "error"?: str|None}
#   the one answer that ends an exec's req_id (the gateway forgets the req_id then).
#   A refusal (another run still going, no such run, a bad request) carries "reason"
#   in users' words, status "finished", exit_code None and no records; a run's own
#   answer has reason None. run_id is "" when there is no run (complete, and a
#   refusal that names none). "error": how a run that ended failed, the name of the
#   exception a query raised (KeyboardInterrupt for a run interrupted, a batch's too),
#   absent or null otherwise; bounds: ERROR_NAME below.
EXEC_RESULT = "exec_result"
# Record: {"kind": one of EXEC_RECORD_KINDS, "data": str, "mime": str|None}
#   stdout/stderr: text. result/display: "mime" is the chosen type of the bundle
#   (image/png with base64 data, image/svg+xml, text/html, text/plain, in that order
#   of preference). error: the traceback as text (ANSI escapes kept). notice: the
#   agent's or runner's word, e.g. the output limit's cut marker.
EXEC_RECORD_KINDS = ("stdout", "stderr", "result", "display", "error", "notice")
EXEC_FINISHED = "finished"
EXEC_CONTINUED = "continued"  # the run goes on: ask again with mode "continue"
EXEC_WAITING_INPUT = "waiting-input"  # the run waits for a line: mode "input"
EXEC_TIMEOUT = "exec-timeout"  # the run outlived options.timeout and was interrupted
EXEC_STATUSES = (EXEC_FINISHED, EXEC_CONTINUED, EXEC_WAITING_INPUT, EXEC_TIMEOUT)

# KernelReport: {"kernel_id": str, "session_id": str,
#   "status": one of KERNEL_REPORT_STATUSES, "exit_code": int|None,
#   "container_id": str|None, "reason": str|None, "sftp"?: SftpReport|None}
# SftpReport (an SFTP kernel, once its port is published; SFTP_REPORT below):
#   {"host": str, "port": int, "host_key_fingerprint": "SHA256:...", "connections": int,
#    "idle_for": float|None}  -- where users connect (the agent's public host and the port
#   it listens on), the connections open now, and the seconds since the last one ended
#   (0 while one is open, None before the first). Sent again whenever a connection opens
#   or ends, and in every heartbeat: connections are the session's activity.
KR_PREPARING = "preparing"  # creating network / container
KR_PULLING = "pulling"  # only when the agent option to pull images is on
KR_RUNNING = "running"
KR_EXITED = "exited"  # the kernel's process / container ended; exit_code is set
KR_ERROR = "error"  # could not be created; reason says why (e.g. image missing)
KR_GONE = "gone"  # destroyed on request; nothing is left on the node
KERNEL_REPORT_STATUSES = (KR_PREPARING, KR_PULLING, KR_RUNNING, KR_EXITED, KR_ERROR, KR_GONE)
# Notes on reports (agent behaviour, no new fields):
# - "gone" for a kernel the agent never knew carries "session_id": "" (it cannot know it).
# - "exited" may carry "exit_code": None with a reason when the agent cannot learn the
#   code (a process-backend kernel that ended while the agent was down).
# - "container_id" is the Docker container id, or the process group id (as a string)
#   on the process backend.
# - a term_input or term_close for an unknown term_id is answered with term_closed
#   ("no such terminal"), so the browser side can stop waiting.

# --- manager -> agent -------------------------------------------------------
# {"type": "registered", "agent_id": str, "heartbeat_interval": float,
#  "log_tail_bytes": int, "exec_output_limit": int}
#   log_tail_bytes: how much of each kernel's log the agent keeps and sends as
#   its log_tail (the manager's one setting, BAI_LOG_TAIL_BYTES), within the bounds below.
#   exec_output_limit: the most record data one code run may produce
#   (BAI_EXEC_OUTPUT_LIMIT); past it the runner drops output and says so once.
REGISTERED = "registered"
LOG_TAIL_BYTES_DEFAULT = 64 * 1024
LOG_TAIL_BYTES_MIN = 1024
LOG_TAIL_BYTES_MAX = 16 * 1024 * 1024
EXEC_OUTPUT_LIMIT_DEFAULT = 8 * 1024 * 1024
EXEC_OUTPUT_LIMIT_MIN = 64 * 1024
EXEC_OUTPUT_LIMIT_MAX = 256 * 1024 * 1024
# {"type": "create_kernels", "session_id": str, "network": str,
#  "cluster_mode": "single-node"|"multi-node", "session_type": str,
#  "ssh": {"private_key": str, "public_key": str}|None,
#  "kernels": [KernelSpec, ...]}  -- only the kernels placed on this agent.
# KernelSpec: {"kernel_id": str, "hostname": "main1"|"subN", "role": "main"|"sub",
#   "image": str, "slots": {slot: str}, "env": {str: str},
#   "mounts": [{"name": str, "host_path": str, "readonly"?: true}], "startup_command": str|None,
#   (a read-only mount is a read-only share: a backend that cannot make one refuses the kernel)
#   "cluster_hosts": ["main1", "sub1", ...], "service_ports": [int, ...]}
#   service_ports: main1's app ports (the image's and the user's); a kernel with any
#   is given a network even when alone, so that the agent's host reaches it.
#   "sftp"?: {"authorized_keys": [str], "quotas": [{"max_bytes": int|None,
#     "other_bytes": int, "folders": [name]}]}  -- an SFTP system session's kernel: the agent
#   runs its SFTP server (agent/sftp_server.py) instead of a start command, on SFTP_PORT, lets
#   in the session's key and these public keys, and publishes the port (agent/publish.py).
#   A mount may carry "readonly": true (mounted read-only; the SFTP server refuses writes).
# The env already holds every BACKENDAI_* variable; the agent adds nothing but
# may read them. Creating a kernel that already exists is a no-op that re-reports it.
CREATE_KERNELS = "create_kernels"
# {"type": "destroy_kernels", "kernel_ids": [str], "reason": str}
#   destroying an unknown kernel reports it "gone" (idempotent). When the last
#   kernel of a session on this agent is gone, its network goes too.
DESTROY_KERNELS = "destroy_kernels"
# {"type": "logs_follow", "kernel_id": str, "stream_id": str, "tail": int}
#   send the last `tail` bytes then every new chunk as log_chunk frames.
LOGS_FOLLOW = "logs_follow"
# {"type": "logs_stop", "stream_id": str}
LOGS_STOP = "logs_stop"
# {"type": "term_open", "term_id": str, "kernel_id": str, "cols": int, "rows": int}
#   opening an id that is already open re-attaches to the same shell.
TERM_OPEN = "term_open"
# {"type": "term_input", "term_id": str, "data": str}
TERM_INPUT = "term_input"
# {"type": "term_resize", "term_id": str, "cols": int, "rows": int}
TERM_RESIZE = "term_resize"
# {"type": "term_detach", "term_id": str}
#   the browser went away without closing: keep the shell for a grace period
#   (default 120 s) so that a term_open with the same id re-attaches to it.
TERM_DETACH = "term_detach"
# {"type": "term_close", "term_id": str}  -- end the shell now.
TERM_CLOSE = "term_close"
# {"type": "tunnel_open", "tunnel_id": str, "kernel_id": str, "port": int, "url": str,
#  "token": str, "start_command": str, "app_token": str}
#   connect to `port` of the kernel (the Docker backend: the container's address on its
#   session network; the process backend: 127.0.0.1), then open a websocket to `url`
#   (the apps proxy's /tunnel/<tunnel_id>/) with `token` as its bearer, and carry bytes
#   both ways in binary frames until either side closes. When nothing listens and a
#   start command is given, run it first (as the kernel user, in its home, with
#   BAI_APP_BIND, BAI_APP_PORT and BAI_APP_TOKEN set) and wait for the port. A tunnel
#   that cannot reach the port still dials the proxy and closes with TUNNEL_FAILED and
#   the reason, so the proxy answers at once. Bounds: TUNNEL_OPEN_FIELDS below.
TUNNEL_OPEN = "tunnel_open"
TUNNEL_FAILED = 4502  # close code of a tunnel whose port could not be reached
# {"type": "exec", "req_id": str(32 hex), "kernel_id": str, "mode": one of EXEC_MODES,
#  "run_id": str|None, "code": str, "options": {...}, "stream": bool, "flush": float}
#   run code in the kernel's code runner (one ipykernel per kernel, started on first
#   use, so state persists between runs), at most one run per kernel at a time.
#   query/batch start a run (run_id, or a new one of 16 hex when None); continue asks
#   for more of run_id (with run_id null and stream true: attach to the run that is
#   going, running or waiting for input, refused when none is; the run's earlier
#   streams end with status "continued", the output goes to the newest); input gives a waiting run its line (in "code"); interrupt
#   interrupts run_id (or the current run); complete lists completions of "code" at
#   options.cursor_pos. options: build, exec (batch shell commands), timeout (seconds,
#   0 = none), cursor_pos. The agent answers within `flush` seconds with one
#   exec_result (sooner when the run finishes or waits for input); with "stream" it
#   sends exec_records as records come, then one exec_result when the run finishes or
#   waits. Absent fields mean: code "", options {}, stream false, flush 1.5.
#   Bounds: MANAGER_MESSAGES[EXEC] below.
EXEC = "exec"
EXEC_MODES = ("query", "batch", "continue", "input", "interrupt", "complete")
EXEC_FLUSH_DEFAULT = 1.5
# {"type": "error", "message": str, "stream_id"?: str}
#   either direction. Added for the agent: a failed logs_follow (e.g. unknown kernel)
#   answers with an error carrying that request's "stream_id", so the gateway can tell
#   the one browser stream; the field is absent in other errors. The manager answers
#   every frame it refuses (malformed, out of bounds, or about another agent's kernels)
#   with an error saying why; the connection stays open.
ERROR = "error"


# --- bounds of every agent -> manager field ----------------------------------
# The manager refuses a frame (with an "error" answer; the connection stays open)
# when any field is missing, unknown, of another type or out of these bounds.
# Lengths are in characters. Text never holds a lone surrogate, and text that the
# manager stores (everything but "data") never holds NUL.
ID_MAX = 128  # kernel_id, session_id, stream_id, term_id: [A-Za-z0-9._:-]
CONTAINER_ID_MAX = 128
REASON_MAX = 500  # a report's or a closed terminal's reason
MESSAGE_MAX = 2000  # an error's message
HOSTNAME_MAX = 255
VERSION_MAX = 64
RESOURCE_GROUP_MAX = 64  # only ever logged: the group is the admin's to set
BACKENDS = ("docker", "process")
LABELS_MAX = 64
LABEL_KEY_MAX = 64
LABEL_VALUE_MAX = 256
REPORTS_MAX = 4096  # kernel reports in one register or heartbeat
EXIT_CODE_MIN = -(2**31)  # exit codes fit a signed 32-bit integer
EXIT_CODE_MAX = 2**31 - 1
# Slots: at most SLOTS_MAX names like "cpu" or "cuda.device", each with a finite,
# non-negative amount of at most SLOT_AMOUNT_MAX, as a decimal string (an integer
# is accepted too) with at most SLOT_PLACES decimal places: mem in whole bytes,
# every other slot in thousandths (the manager's own slot precision).
SLOTS_MAX = 32
SLOT_NAME_MAX = 64
SLOT_AMOUNT_MAX = 10**15
SLOT_PLACES = {"mem": 0}
SLOT_PLACES_DEFAULT = 3
# Stream data: one log_chunk carries at most 256 KiB of output (decoded, so a few
# characters more), one term_output at most what a shell wrote between two reads
# plus the replay; a log_tail at most LOG_TAIL_BYTES_MAX.
LOG_CHUNK_DATA_MAX = 256 * 1024 + 16
TERM_DATA_MAX = 1024 * 1024
LOG_TAIL_DATA_MAX = LOG_TAIL_BYTES_MAX
# Exec frames: at most EXEC_RECORDS_MAX records whose data is at most EXEC_FRAME_DATA
# bytes of utf-8 (the agent cuts there; the check counts characters, plus room for
# the agent's own notices); a frame fits EXEC_FRAME_CHARS with every byte escaped.
EXEC_FRAME_DATA = 1024 * 1024
EXEC_DATA_MAX = EXEC_FRAME_DATA + 4 * 1024
EXEC_RECORDS_MAX = 4096
EXEC_MIME_MAX = 100
EXEC_COMPLETIONS_MAX = 1000
EXEC_COMPLETION_MAX = 1000
EXEC_FRAME_CHARS = 6 * EXEC_DATA_MAX + 64 * EXEC_RECORDS_MAX + 64 * 1024
# A whole frame: at least FRAME_CHARS_MIN characters (room for an exec frame), and
# room for the configured log tail with every byte escaped (JSON escapes one byte as
# at most 6 characters).
FRAME_CHARS_MIN = max(4 * 1024 * 1024, EXEC_FRAME_CHARS)
JSON_INT_DIGITS = 20  # longer integer literals are refused before they are converted
JSON_FLOAT_CHARS = 40

_ID = re.compile(r"[A-Za-z0-9._:-]+", re.ASCII)
_SLOT_NAME = re.compile(r"[A-Za-z][A-Za-z0-9._-]*", re.ASCII)
_AMOUNT = re.compile(r"[0-9]{1,20}(?:\.[0-9]{1,20})?(?:[eE][+-]?[0-9]{1,4})?", re.ASCII)
_SURROGATE = re.compile("[\ud800-\udfff]")


def max_frame_chars(log_tail_bytes: int = LOG_TAIL_BYTES_DEFAULT) -> int:
    """The largest agent frame (in characters) a manager keeping ``log_tail_bytes`` accepts."""
    return max(FRAME_CHARS_MIN, 6 * log_tail_bytes + 64 * 1024)


class FrameError(ValueError):
    """A frame that is not a JSON object within the bounds; the text says why."""


def _shown(value: object) -> str:
    """A value as an error message shows it: short, and cheap whatever its size."""
    if isinstance(value, str | bytes | list | dict) and len(value) > 40:
        return f"{type(value).__name__} of length {len(value)}"
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def _no_constant(name: str) -> Any:
    raise FrameError(f"{name} is not a number JSON allows")


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > JSON_INT_DIGITS:
        raise FrameError(f"an integer of {len(text)} digits (at most {JSON_INT_DIGITS})")
    return int(text)


def _bounded_float(text: str) -> float:
    if len(text) > JSON_FLOAT_CHARS:
        raise FrameError(f"a number of {len(text)} characters (at most {JSON_FLOAT_CHARS})")
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise FrameError(f"{text} is out of range")
    return value


def decode_frame(text: str, *, max_chars: int = FRAME_CHARS_MIN) -> dict[str, Any]:
    """One websocket text frame as a JSON object, or FrameError: too long, not JSON,
    nested too deeply, NaN or Infinity, a number too long to convert, not an object."""
    if len(text) > max_chars:
        raise FrameError(f"a frame of {len(text)} characters (at most {max_chars})")
    try:
        value = json.loads(
            text,
            parse_constant=_no_constant,
            parse_int=_bounded_int,
            parse_float=_bounded_float,
        )
    except RecursionError:
        raise FrameError("nested too deeply") from None
    except FrameError:
        raise
    except ValueError as exc:
        raise FrameError(f"not JSON ({str(exc)[:100]})") from None
    if not isinstance(value, dict):
        raise FrameError(f"a frame must be a JSON object, not {type(value).__name__}")
    return value


# Field rules: each returns why a value is refused, or None.
Rule = Callable[[Any], "str | None"]


def text(
    max_chars: int,
    *,
    pattern: re.Pattern[str] | None = None,
    choices: tuple[str, ...] | None = None,
    nul: bool = False,
    empty: bool = True,
) -> Rule:
    """A string of at most ``max_chars`` (matching ``pattern``, one of ``choices``)."""

    def check(value: Any) -> str | None:
        if not isinstance(value, str):
            return f"must be a string, not {_shown(value)}"
        if not value and not empty:
            return "must not be empty"
        if len(value) > max_chars:
            return f"{len(value)} characters (at most {max_chars})"
        if not value.isascii():
            if _SURROGATE.search(value):
                return "holds a lone surrogate (not UTF-8 text)"
        if not nul and "\x00" in value:
            return "holds a NUL character"
        if choices is not None and value not in choices:
            return f"{_shown(value)} is not one of {', '.join(choices)}"
        if pattern is not None and value and not pattern.fullmatch(value):
            return f"{_shown(value)} has characters outside {pattern.pattern}"
        return None

    return check


def integer(low: int, high: int) -> Rule:
    def check(value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int):
            return f"must be an integer, not {_shown(value)}"
        if not low <= value <= high:
            return f"{_shown(value)} is outside {low}..{high}"
        return None

    return check


def slot_amount_refusal(slot: str, value: Any) -> str | None:
    """Why ``value`` is not an amount of ``slot`` the protocol carries, or None."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        return f"must be a decimal string, not {_shown(value)}"
    if isinstance(value, str):
        if value.startswith("-"):
            return "must not be negative"
        if len(value) > 48 or not _AMOUNT.fullmatch(value):
            return f"{_shown(value)} is not a finite decimal number"
    number = Decimal(value)
    if number < 0:
        return "must not be negative"
    if number > SLOT_AMOUNT_MAX:
        return f"{_shown(value)} is more than {SLOT_AMOUNT_MAX:.0e}"
    _, digits, exponent = number.as_tuple()
    assert isinstance(exponent, int)  # finite: the pattern admits nothing else
    trailing_zeros = len(digits) - len("".join(map(str, digits)).rstrip("0"))
    places = max(0, -exponent - trailing_zeros) if number else 0
    allowed = SLOT_PLACES.get(slot, SLOT_PLACES_DEFAULT)
    if places > allowed:
        return "must be a whole number" if allowed == 0 else f"at most {allowed} decimal places"
    return None


def slot_map(value: Any) -> str | None:
    if not isinstance(value, dict):
        return f"must be an object of slot amounts, not {_shown(value)}"
    if len(value) > SLOTS_MAX:
        return f"{len(value)} slots (at most {SLOTS_MAX})"
    for name, amount in value.items():
        if len(name) > SLOT_NAME_MAX or not _SLOT_NAME.fullmatch(name):
            return f"{_shown(name)} is not a slot name"
        refusal = slot_amount_refusal(name, amount)
        if refusal:
            return f"{name}: {refusal}"
    return None


_LABEL_KEY = text(LABEL_KEY_MAX)
_LABEL_VALUE = text(LABEL_VALUE_MAX)


def label_map(value: Any) -> str | None:
    if not isinstance(value, dict):
        return f"must be an object of labels, not {_shown(value)}"
    if len(value) > LABELS_MAX:
        return f"{len(value)} labels (at most {LABELS_MAX})"
    for key, label in value.items():
        refusal = "empty" if not key else _LABEL_KEY(key)
        if refusal:
            return f"label key {_shown(key)}: {refusal}"
        refusal = _LABEL_VALUE(label)
        if refusal:
            return f"label {key}: {refusal}"
    return None


@dataclass(frozen=True)
class Field:
    """One field of a message: its rule, whether it must be there, whether null is allowed."""

    rule: Rule
    required: bool = False
    nullable: bool = False


def record_refusal(fields: Mapping[str, Field], value: Any, *, skip: str = "") -> str | None:
    """Why an object is not a record of ``fields`` (no unknown keys), or None."""
    if not isinstance(value, dict):
        return f"must be an object, not {_shown(value)}"
    for key in value:
        if key != skip and key not in fields:
            return f"unknown field {_shown(key)}"
    for name, field in fields.items():
        if name not in value:
            if field.required:
                return f"{name}: missing"
            continue
        item = value[name]
        if item is None:
            if field.nullable:
                continue
            return f"{name}: must not be null"
        refusal = field.rule(item)
        if refusal:
            return f"{name}: {refusal}"
    return None


def list_of(item: Mapping[str, Field] | Rule, max_items: int) -> Rule:
    """A list of at most ``max_items`` records of these fields, or values of this rule."""

    def check(value: Any) -> str | None:
        if not isinstance(value, list):
            return f"must be a list, not {_shown(value)}"
        if len(value) > max_items:
            return f"{len(value)} items (at most {max_items})"
        for index, entry in enumerate(value):
            if callable(item):
                refusal = item(entry)
                if refusal:
                    return f"[{index}]: {refusal}"
            else:
                refusal = record_refusal(item, entry)
                if refusal:
                    return f"[{index}].{refusal}"
        return None

    return check


def number(low: float, high: float) -> Rule:
    """An integer or a finite float within low..high."""

    def check(value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"must be a number, not {_shown(value)}"
        if not low <= value <= high:  # NaN fails this too
            return f"{_shown(value)} is outside {low:g}..{high:g}"
        return None

    return check


def boolean(value: Any) -> str | None:
    return None if isinstance(value, bool) else f"must be true or false, not {_shown(value)}"


def utf8_text(max_bytes: int) -> Rule:
    """A string of at most ``max_bytes`` once utf-8 encoded (NUL allowed: never stored)."""
    within_chars = text(max_bytes, nul=True)

    def check(value: Any) -> str | None:
        refusal = within_chars(value)
        if refusal:
            return refusal
        size = len(value.encode())
        return f"{size} bytes of utf-8 (at most {max_bytes})" if size > max_bytes else None

    return check


_KERNEL_ID = Field(text(ID_MAX, pattern=_ID, empty=False), required=True)
_TERM_ID = Field(text(ID_MAX, pattern=_ID, empty=False), required=True)
_REQ_ID = re.compile(r"[0-9a-fA-F]{32}", re.ASCII)
_RUN_ID = re.compile(r"[A-Za-z0-9_-]+", re.ASCII)
RUN_ID_MAX = 64
EXEC_RECORD: dict[str, Field] = {
    "kind": Field(text(16, choices=EXEC_RECORD_KINDS), required=True),
    "data": Field(text(EXEC_DATA_MAX, nul=True), required=True),
    "mime": Field(text(EXEC_MIME_MAX), nullable=True),
}
_EACH_RECORD = list_of(EXEC_RECORD, EXEC_RECORDS_MAX)


def exec_records(value: Any) -> str | None:
    """A list of records whose data is EXEC_DATA_MAX characters at most in all."""
    refusal = _EACH_RECORD(value)
    if refusal:
        return refusal
    total = sum(len(record["data"]) for record in value)
    if total > EXEC_DATA_MAX:
        return f"{total} characters of data in all (at most {EXEC_DATA_MAX})"
    return None


ERROR_NAME_MAX = 100
ERROR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*", re.ASCII)
ERROR_NAME_RULE = text(ERROR_NAME_MAX, pattern=ERROR_NAME, empty=False)
_EXEC_ANSWER: dict[str, Field] = {
    "req_id": Field(text(32, pattern=_REQ_ID, empty=False), required=True),
    "run_id": Field(text(RUN_ID_MAX, pattern=_RUN_ID), required=True),
    "records": Field(exec_records, required=True),
}
SFTP_PORT = 2200  # where an SFTP kernel's server listens, inside the kernel
SFTP_CONNECTIONS_MAX = 10**6
SFTP_IDLE_MAX = 10.0**9
SFTP_REPORT: dict[str, Field] = {
    "host": Field(text(HOSTNAME_MAX), required=True),
    "port": Field(integer(1, 65535), required=True),
    "host_key_fingerprint": Field(text(128)),
    "connections": Field(integer(0, SFTP_CONNECTIONS_MAX), required=True),
    "idle_for": Field(number(0, SFTP_IDLE_MAX), nullable=True),
}


def sftp_report(value: Any) -> str | None:
    return record_refusal(SFTP_REPORT, value)


KERNEL_REPORT: dict[str, Field] = {
    "kernel_id": _KERNEL_ID,
    # "" when the agent cannot know it (a "gone" for a kernel it never had).
    "session_id": Field(text(ID_MAX, pattern=_ID)),
    "status": Field(text(16, choices=KERNEL_REPORT_STATUSES), required=True),
    "exit_code": Field(integer(EXIT_CODE_MIN, EXIT_CODE_MAX), nullable=True),
    "container_id": Field(text(CONTAINER_ID_MAX, pattern=_ID), nullable=True),
    "reason": Field(text(REASON_MAX), nullable=True),
    "sftp": Field(sftp_report, nullable=True),
}
_REPORTS = Field(list_of(KERNEL_REPORT, REPORTS_MAX), required=True)

# Message type -> its fields ("type" aside). Nothing else is accepted from an agent.
AGENT_MESSAGES: dict[str, dict[str, Field]] = {
    REGISTER: {
        "protocol": Field(integer(0, 2**31 - 1), nullable=True),
        "hostname": Field(text(HOSTNAME_MAX)),
        "backend": Field(text(16, choices=BACKENDS)),
        "resource_group": Field(text(RESOURCE_GROUP_MAX), nullable=True),
        "slots": Field(slot_map),
        "labels": Field(label_map),
        "version": Field(text(VERSION_MAX)),
        "kernels": _REPORTS,
    },
    HEARTBEAT: {"kernels": _REPORTS, "slots": Field(slot_map, nullable=True)},
    KERNEL_STATUS: KERNEL_REPORT,
    LOG_CHUNK: {
        "kernel_id": _KERNEL_ID,
        "stream_id": Field(text(ID_MAX, pattern=_ID, empty=False), required=True),
        "data": Field(text(LOG_CHUNK_DATA_MAX, nul=True), required=True),
    },
    LOG_TAIL: {
        "kernel_id": _KERNEL_ID,
        "data": Field(text(LOG_TAIL_DATA_MAX, nul=True), required=True),
    },
    TERM_OUTPUT: {
        "term_id": _TERM_ID,
        "data": Field(text(TERM_DATA_MAX, nul=True), required=True),
    },
    TERM_CLOSED: {"term_id": _TERM_ID, "reason": Field(text(REASON_MAX), nullable=True)},
    EXEC_RECORDS: _EXEC_ANSWER,
    EXEC_RESULT: {
        **_EXEC_ANSWER,
        "status": Field(text(16, choices=EXEC_STATUSES), required=True),
        "exit_code": Field(integer(EXIT_CODE_MIN, EXIT_CODE_MAX), nullable=True),
        "completions": Field(
            list_of(text(EXEC_COMPLETION_MAX), EXEC_COMPLETIONS_MAX), nullable=True
        ),
        "reason": Field(text(REASON_MAX), nullable=True),
        "error": Field(ERROR_NAME_RULE, nullable=True),
    },
    ERROR: {
        "message": Field(text(MESSAGE_MAX), nullable=True),
        "stream_id": Field(text(ID_MAX, pattern=_ID)),
    },
}


# --- bounds of the manager -> agent commands that the gateway checks ---------
URL_MAX = 2048
TOKEN_MAX = 512
START_COMMAND_MAX = 2048
_URL = re.compile(r"wss?://[A-Za-z0-9._:\[\]-]+(?:/[A-Za-z0-9._~/%-]*)?", re.ASCII)
_TOKEN = re.compile(r"[A-Za-z0-9._:~-]+", re.ASCII)
EXEC_CODE_MAX = 1024 * 1024  # utf-8 bytes of code (or of the line typed)
EXEC_COMMAND_MAX = 64 * 1024  # utf-8 bytes of a batch's build or exec command
EXEC_TIMEOUT_MAX = 86400.0
EXEC_FLUSH_MIN = 0.05
EXEC_FLUSH_MAX = 5.0
EXEC_OPTIONS: dict[str, Field] = {
    "build": Field(utf8_text(EXEC_COMMAND_MAX)),
    "exec": Field(utf8_text(EXEC_COMMAND_MAX)),
    "timeout": Field(number(0, EXEC_TIMEOUT_MAX)),
    "cursor_pos": Field(integer(0, EXEC_CODE_MAX)),  # the agent clamps it to len(code)
}


def exec_options(value: Any) -> str | None:
    return record_refusal(EXEC_OPTIONS, value)


MANAGER_MESSAGES: dict[str, dict[str, Field]] = {
    TUNNEL_OPEN: {
        "tunnel_id": Field(text(ID_MAX, pattern=_ID, empty=False), required=True),
        "kernel_id": _KERNEL_ID,
        "port": Field(integer(1, 65535), required=True),
        "url": Field(text(URL_MAX, pattern=_URL, empty=False), required=True),
        "token": Field(text(TOKEN_MAX, pattern=_TOKEN, empty=False), required=True),
        "start_command": Field(text(START_COMMAND_MAX)),
        "app_token": Field(text(TOKEN_MAX, pattern=_TOKEN)),
    },
    EXEC: {
        "req_id": Field(text(32, pattern=_REQ_ID, empty=False), required=True),
        "kernel_id": _KERNEL_ID,
        "mode": Field(text(16, choices=EXEC_MODES), required=True),
        "run_id": Field(text(RUN_ID_MAX, pattern=_RUN_ID, empty=False), nullable=True),
        "code": Field(utf8_text(EXEC_CODE_MAX)),
        "options": Field(exec_options),
        "stream": Field(boolean),
        "flush": Field(number(EXEC_FLUSH_MIN, EXEC_FLUSH_MAX)),
    },
}


def validate_command(message: Any) -> str | None:
    """Why a manager -> agent command of ``MANAGER_MESSAGES`` breaks its bounds (the
    gateway checks before it sends; the agent checks again before it acts)."""
    if not isinstance(message, dict):
        return "a command must be a JSON object"
    kind = message.get("type")
    fields = MANAGER_MESSAGES.get(kind) if isinstance(kind, str) else None
    if fields is None:
        return f"unknown command type {_shown(kind)}"
    refusal = record_refusal(fields, message, skip="type")
    return f"{kind}.{refusal}" if refusal else None


def validate(message: Any) -> str | None:
    """Why an agent -> manager message breaks the protocol, or None when every
    field is known, present when required, and within its bounds."""
    if not isinstance(message, dict):
        return f"a frame must be a JSON object, not {type(message).__name__}"
    kind = message.get("type")
    fields = AGENT_MESSAGES.get(kind) if isinstance(kind, str) else None
    if fields is None:
        return f"unknown message type {_shown(kind)}"
    refusal = record_refusal(fields, message, skip="type")
    return f"{kind}.{refusal}" if refusal else None


def _too_long(value: Any, limit: int) -> bool:
    return isinstance(value, str) and len(value) > limit


def fit(frame: dict[str, Any]) -> dict[str, Any]:
    """The agent's side of the bounds: free text (reasons, messages, hostname,
    version) cut to fit, so that a long error text never gets a report refused.
    The frame itself when nothing is too long (the usual case, on the terminal's
    hot path), else a cut copy; ids and data are left alone."""
    cuts = _REGISTER_CUTS if frame.get("type") == REGISTER else _CUTS
    fitted = frame
    for key, limit in cuts.items():
        if _too_long(frame.get(key), limit):
            fitted = fitted if fitted is not frame else dict(frame)
            fitted[key] = frame[key][:limit]
    kernels = frame.get("kernels")
    if isinstance(kernels, list) and any(
        isinstance(k, dict) and _too_long(k.get("reason"), REASON_MAX) for k in kernels
    ):
        fitted = fitted if fitted is not frame else dict(frame)
        fitted["kernels"] = [
            {**k, "reason": k["reason"][:REASON_MAX]}
            if isinstance(k, dict) and _too_long(k.get("reason"), REASON_MAX)
            else k
            for k in kernels
        ]
    return fitted


_CUTS = {"reason": REASON_MAX, "message": MESSAGE_MAX}
_REGISTER_CUTS = {**_CUTS, "hostname": HOSTNAME_MAX, "version": VERSION_MAX}


# --- inside the manager: the channel layer ---------------------------------
# Browser consumers and the agent gateway talk over the channel layer with these
# events (never seen by the agent itself).
# {"type": "agent.command", "command": <a manager -> agent frame>,
#  "reply"?: <the sender's channel>, "ack"?: int}
#   to an agent's gateway (its group, or its channel once known). A terminal's
#   commands carry "reply" (where its output goes) and, while sent through the
#   group, "ack" (a count the gateway echoes in term.route).
GW_AGENT_COMMAND = "agent.command"
# {"type": "agent.reconcile"}: reconcile now (the scheduler placed or a session is ending).
GW_AGENT_RECONCILE = "agent.reconcile"
# {"type": "agent.replaced", "channel": str}: a newer connection of the agent took over.
GW_AGENT_REPLACED = "agent.replaced"
# {"type": "term.route", "gateway": <gateway channel>|None, "ack"?: int, "from"?: <channel>}
#   gateway -> terminal consumer: send your commands straight to this channel from
#   now on (after the command numbered "ack"); None: that gateway ("from") went away.
GW_TERM_ROUTE = "term.route"
# Streams out to the browser consumers: {"type": "logs.chunk", "kernel_id", "data"},
# {"type": "term.output", "data"}, {"type": "term.closed", "reason"}.
GW_LOGS_CHUNK = "logs.chunk"
GW_TERM_OUTPUT = "term.output"
GW_TERM_CLOSED = "term.closed"
# Code runs: an exec's answers go to the channel that sent it (its "reply") as
# {"type": "exec.records"|"exec.result", <the agent frame's fields>}; when the
# agent's connection ends first, {"type": "exec.lost", "req_id", "reason"}.
GW_EXEC_RECORDS = "exec.records"
GW_EXEC_RESULT = "exec.result"
GW_EXEC_LOST = "exec.lost"


def gw_agent_command(
    command: dict[str, object], *, reply: str | None = None, ack: int | None = None
) -> dict[str, object]:
    event: dict[str, object] = {"type": GW_AGENT_COMMAND, "command": command}
    if reply is not None:
        event["reply"] = reply
    if ack is not None:
        event["ack"] = ack
    return event


def gw_term_route(
    gateway: str | None, *, ack: int | None = None, sender: str | None = None
) -> dict[str, object]:
    event: dict[str, object] = {"type": GW_TERM_ROUTE, "gateway": gateway}
    if ack is not None:
        event["ack"] = ack
    if sender is not None:
        event["from"] = sender
    return event


def agent_group(agent_id: str) -> str:
    """Channel-layer group of one agent's gateway connection (manager -> agent)."""
    return f"agent.{_safe(agent_id)}"


def terminal_group(term_id: str) -> str:
    """Group that receives one terminal's output (agent -> browser)."""
    return f"term.{_safe(term_id)}"


def log_stream_group(stream_id: str) -> str:
    """Group that receives one followed log stream (agent -> browser)."""
    return f"logs.{_safe(stream_id)}"


def user_group(user_id: int | str) -> str:
    """Group of one user's session-list pushes (manager -> browser)."""
    return f"user.{_safe(str(user_id))}"


def _safe(value: str) -> str:
    # Channel-layer group names allow only ASCII alphanumerics, hyphens,
    # underscores and periods, and must be shorter than 100 characters.
    cleaned = "".join(c if c.isalnum() or c in "-_." else "_" for c in value)
    return cleaned[:80]
