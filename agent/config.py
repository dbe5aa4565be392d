"""Command-line options of the agent and detection of the node's capacity.

Pure functions over the host's files (``/proc``, cgroups) and ``nvidia-smi``; no network.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import math
import os
import socket
import subprocess
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

from bai_common.units import parse_size

from . import protocol

log = logging.getLogger(__name__)

DEFAULT_TERM_GRACE = 120.0
DEFAULT_KERNEL_TMP_SIZE = 256 * 1024**2
# Process kernels run as uid BASE+1, BASE+2, … (one each) in group BASE: far above
# the ranges that distributions give to people, services and subordinate ids.
DEFAULT_KERNEL_UID_BASE = 2_000_000_000


def _size_option(text: str) -> int:
    """``--mem 4g``: the units' rule, with its message on the command line."""
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_label(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ValueError(f"not a label: {text!r} (use key=value)")
    return key, value


@dataclass
class AgentConfig:
    manager: str = "ws://127.0.0.1:8000"
    token: str = field(default="", repr=False)
    backend: str = "auto"
    # The Docker engine's address (unix:// or tcp://); None: DOCKER_HOST or the default socket.
    docker_host: str | None = None
    resource_group: str | None = None
    cpu: Decimal | None = None
    mem: int | None = None
    gpus: int | None = None
    work_dir: Path = field(default_factory=lambda: Path("var/agent").absolute())
    data_root: Path | None = None
    # Set by the manager at registration (protocol.REGISTERED).
    log_tail_bytes: int = protocol.LOG_TAIL_BYTES_DEFAULT
    exec_output_limit: int = protocol.EXEC_OUTPUT_LIMIT_DEFAULT
    pull: bool = False
    labels: dict[str, str] = field(default_factory=dict)
    term_grace: float = DEFAULT_TERM_GRACE
    hostname: str = field(default_factory=socket.gethostname)
    stop_timeout: int = 2
    kernel_tmp_size: int = DEFAULT_KERNEL_TMP_SIZE
    kernel_uid_base: int = DEFAULT_KERNEL_UID_BASE
    # The process backend's python for the code runner (None: the agent's own when
    # kernels can run it, else python3 on the kernel's PATH).
    runner_python: str | None = None
    # Where published kernel ports (SFTP sessions) listen, and the name users are told to
    # connect to (None: the address itself, or the hostname when it is a wildcard).
    public_address: str = "127.0.0.1"
    public_host: str | None = None
    # HOST:PORT where the agent serves its Prometheus metrics; None: not served.
    metrics_address: str | None = None

    @property
    def advertised_host(self) -> str:
        if self.public_host:
            return self.public_host
        if self.public_address in ("0.0.0.0", "::", ""):  # noqa: S104 - a comparison
            return self.hostname
        return self.public_address

    @property
    def agent_key(self) -> str:
        """A stable, non-secret fingerprint of the token.

        Containers carry it as a label so that a restarted agent finds its own
        kernels before the manager has told it its id again.
        """
        return hashlib.sha256(self.token.encode()).hexdigest()[:16]

    @property
    def ws_url(self) -> str:
        return self.manager.rstrip("/") + "/ws/agent/"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m agent", description="Backend.AI-style node agent")
    p.add_argument("--manager", required=True, help="manager base URL, e.g. ws://127.0.0.1:8000")
    p.add_argument(
        "--token",
        default=os.environ.get("BACKENDAI_AGENT_TOKEN"),
        help="agent token (or env BACKENDAI_AGENT_TOKEN)",
    )
    p.add_argument("--backend", choices=("docker", "process", "auto"), default="auto")
    p.add_argument(
        "--docker-host",
        default=os.environ.get("DOCKER_HOST") or None,
        help="the Docker engine to run kernels on, e.g. unix:///run/engine2/docker.sock"
        " (or env DOCKER_HOST; default: the engine's usual socket)",
    )
    p.add_argument("--resource-group", default=None)
    p.add_argument("--cpu", type=Decimal, default=None, help="override the CPU core count")
    p.add_argument("--mem", type=_size_option, default=None, help="override memory: bytes or 4g")
    p.add_argument("--gpus", type=int, default=None, help="override the cuda.device count")
    p.add_argument("--work-dir", type=Path, default=Path("var/agent"))
    p.add_argument(
        "--data-root",
        type=Path,
        default=None,
        help="refuse data-folder mounts outside this directory",
    )
    p.add_argument(
        "--kernel-tmp-size",
        type=_size_option,
        default=DEFAULT_KERNEL_TMP_SIZE,
        help="size of a container's /tmp tmpfs (never more than half its memory)",
    )
    p.add_argument(
        "--kernel-uid-base",
        type=int,
        default=DEFAULT_KERNEL_UID_BASE,
        help="process backend as root: kernels run as uid BASE+1, BASE+2, … in group BASE",
    )
    p.add_argument(
        "--runner-python",
        default=None,
        help="process backend: the python (with jupyter_client and ipykernel) that runs code"
        " in kernels (default: the agent's own when kernels can run it, else python3)",
    )
    p.add_argument(
        "--public-address",
        default="127.0.0.1",
        help="the address SFTP sessions' ports are published on (each on a free port);"
        " 0.0.0.0 makes them reachable from other hosts",
    )
    p.add_argument(
        "--public-host",
        default=None,
        help="the host name users are told to connect to (default: the public address,"
        " or this host's name when that is a wildcard)",
    )
    p.add_argument("--pull", action="store_true", help="pull images that are missing")
    p.add_argument("--label", action="append", type=parse_label, default=[], metavar="K=V")
    p.add_argument("--term-grace", type=float, default=DEFAULT_TERM_GRACE)
    p.add_argument(
        "--metrics-address",
        default=os.environ.get("BACKENDAI_AGENT_METRICS"),
        metavar="HOST:PORT",
        help="serve Prometheus metrics at http://HOST:PORT/metrics (or env"
        " BACKENDAI_AGENT_METRICS; default: not served)",
    )
    p.add_argument("--log-level", default="INFO")
    return p


def config_from_args(argv: list[str] | None = None) -> tuple[AgentConfig, argparse.Namespace]:
    parser = build_parser()
    ns = parser.parse_args(argv)
    if not ns.token:
        parser.error("--token (or BACKENDAI_AGENT_TOKEN) is required")
    cfg = AgentConfig(
        manager=ns.manager,
        token=ns.token,
        backend=ns.backend,
        docker_host=ns.docker_host,
        resource_group=ns.resource_group,
        cpu=ns.cpu,
        mem=ns.mem,
        gpus=ns.gpus,
        work_dir=ns.work_dir.absolute(),
        data_root=ns.data_root.absolute() if ns.data_root else None,
        pull=ns.pull,
        labels=dict(ns.label),
        term_grace=ns.term_grace,
        kernel_tmp_size=ns.kernel_tmp_size,
        kernel_uid_base=ns.kernel_uid_base,
        runner_python=ns.runner_python,
        public_address=ns.public_address,
        public_host=ns.public_host,
        metrics_address=ns.metrics_address or None,
    )
    if cfg.metrics_address:
        from agent.metrics import parse_address

        try:
            parse_address(cfg.metrics_address)
        except ValueError as exc:
            parser.error(f"--metrics-address: {exc}")
    if not 0 < cfg.kernel_uid_base < 2**31 - 2**16:
        parser.error("--kernel-uid-base must leave room for 65536 uids below 2^31")
    return cfg, ns


# --- capacity ---------------------------------------------------------------


def detect_cpu(cgroup_root: Path = Path("/sys/fs/cgroup")) -> Decimal:
    """Usable cores: the CPU affinity set, narrowed by a cgroup CPU quota if any."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    quota = _cgroup_cpu_quota(cgroup_root)
    if quota is not None:
        cores = min(cores, max(1, math.floor(quota)))
    return Decimal(cores)


def _cgroup_cpu_quota(root: Path) -> float | None:
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]  # cgroup v2
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text())  # cgroup v1
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return None if quota_us <= 0 else quota_us / period_us
    except (OSError, ValueError):
        return None


def detect_mem(
    meminfo: Path = Path("/proc/meminfo"), cgroup_root: Path = Path("/sys/fs/cgroup")
) -> int:
    """Total memory in bytes, narrowed by a cgroup memory limit if any."""
    total = 0
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                total = int(line.split()[1]) * 1024
                break
    except (OSError, ValueError, IndexError):
        total = 0
    for candidate in (cgroup_root / "memory.max", cgroup_root / "memory" / "memory.limit_in_bytes"):
        try:
            limit = int(candidate.read_text().strip())
        except (OSError, ValueError):
            continue
        if 0 < limit < total or not total:
            total = limit
    return total


def detect_gpus() -> int:
    """Count NVIDIA GPUs from ``nvidia-smi -L``; 0 when it is absent or fails."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def capacity(cfg: AgentConfig) -> dict[str, str]:
    """The resource slots this agent offers, as protocol decimal strings."""
    cpu = cfg.cpu if cfg.cpu is not None else detect_cpu()
    mem = cfg.mem if cfg.mem is not None else detect_mem()
    gpus = cfg.gpus if cfg.gpus is not None else detect_gpus()
    slots = {"cpu": str(cpu), "mem": str(mem)}
    if gpus:
        slots["cuda.device"] = str(gpus)
    return slots
