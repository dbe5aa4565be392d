"""The agent's own Prometheus metrics, served on ``--metrics-address HOST:PORT``
(off unless the admin gives one): its kernels by status, how long creating one
takes, and the errors of its operations.

One agent is one process, so plain prometheus-client metrics in a registry of
its own; the kernels are read from the backend at each scrape.
"""

from __future__ import annotations

import logging
from collections import Counter as Tally
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from agent import protocol

log = logging.getLogger(__name__)

REGISTRY = CollectorRegistry(auto_describe=True)
CREATE_SECONDS = Histogram(
    "bai_agent_kernel_create_seconds",
    "From a create command to the kernel running (or failing), per kernel",
    ["outcome"],
    buckets=(0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0),
    registry=REGISTRY,
)
ERRORS = Counter(
    "bai_agent_errors",
    "Operations of the agent that failed, by operation (create, destroy, command, logs)",
    ["operation"],
    registry=REGISTRY,
)
for _operation in ("create", "destroy", "command", "logs"):
    ERRORS.labels(_operation)


class KernelsCollector(Collector):
    """``bai_agent_kernels{status}``: the kernels the backend holds now."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "bai_agent_kernels", "Kernels on this agent, by status", labels=["status"]
        )
        tally = Tally(k.status for k in list(self.backend.kernels.values()))
        for status in (
            protocol.KR_PREPARING,
            protocol.KR_PULLING,
            protocol.KR_RUNNING,
            protocol.KR_EXITED,
            protocol.KR_ERROR,
        ):
            family.add_metric([status], tally.get(status, 0))
        yield family


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9100`` for IPv6)."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{text!r} is not HOST:PORT")
    return host.strip("[]") or "127.0.0.1", int(port)


def serve(address: str, backend: Any) -> None:
    host, port = parse_address(address)
    REGISTRY.register(KernelsCollector(backend))
    start_http_server(port, addr=host, registry=REGISTRY)
    log.info("metrics on http://%s:%d/metrics", host, port)
