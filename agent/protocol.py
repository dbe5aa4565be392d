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
"""

from __future__ import annotations

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
#   live output of a followed kernel log (stream_id is the one of logs_follow)
LOG_CHUNK = "log_chunk"
# {"type": "log_tail", "kernel_id": str, "data": str}
#   the kept tail (log_tail_bytes of "registered") of a kernel that ended; sent once
#   per end, and again on request (idempotent on the manager).
LOG_TAIL = "log_tail"
# {"type": "term_output", "term_id": str, "data": str}  (utf-8 text, lossy decode)
TERM_OUTPUT = "term_output"
# {"type": "term_closed", "term_id": str, "reason": str}
TERM_CLOSED = "term_closed"

# KernelReport: {"kernel_id": str, "session_id": str,
#   "status": one of KERNEL_REPORT_STATUSES, "exit_code": int|None,
#   "container_id": str|None, "reason": str|None}
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
#  "log_tail_bytes": int}
#   log_tail_bytes: how much of each kernel's log the agent keeps and sends as
#   its log_tail (the manager's one setting, BAI_LOG_TAIL_BYTES), within the bounds below.
REGISTERED = "registered"
LOG_TAIL_BYTES_DEFAULT = 64 * 1024
LOG_TAIL_BYTES_MIN = 1024
LOG_TAIL_BYTES_MAX = 16 * 1024 * 1024
# {"type": "create_kernels", "session_id": str, "network": str,
#  "cluster_mode": "single-node"|"multi-node", "session_type": str,
#  "ssh": {"private_key": str, "public_key": str}|None,
#  "kernels": [KernelSpec, ...]}  -- only the kernels placed on this agent.
# KernelSpec: {"kernel_id": str, "hostname": "main1"|"subN", "role": "main"|"sub",
#   "image": str, "slots": {slot: str}, "env": {str: str},
#   "mounts": [{"name": str, "host_path": str}], "startup_command": str|None,
#   "cluster_hosts": ["main1", "sub1", ...]}
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
# {"type": "error", "message": str, "stream_id"?: str}
#   either direction. Added for the agent: a failed logs_follow (e.g. unknown kernel)
#   answers with an error carrying that request's "stream_id", so the gateway can tell
#   the one browser stream; the field is absent in other errors.
ERROR = "error"


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
