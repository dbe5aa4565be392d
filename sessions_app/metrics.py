"""The manager's Prometheus metrics (``/metrics``), collected at scrape time.

State (sessions waiting and why, sessions and kernels by status, agents, the
Celery queue) is read from the database and Redis at each scrape, so every
process answers the same figures and they agree with the database by
construction. Events counted in other processes (passes, placements, app-proxy
requests) and the websockets each process holds come from the shared store of
``backendai_web.metrics``. docs/operations.md (Metrics) lists every metric.
"""

from __future__ import annotations

import hmac
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import redis
from django.conf import settings
from django.db.models import Count
from django.http import HttpRequest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from backendai_web import metrics as shared
from backendai_web import redis as shared_redis

from .models import ACTIVE, Agent, AgentStatus, Kernel, Session, Status
from .policy import reason_class
from .tokens import user_for_token

# Kombu's Redis transport keeps a queue as one list per priority step (the
# default steps 0, 3, 6, 9; priority 0 is the queue's own name) and the messages
# handed to a worker and not yet acknowledged in one hash.
_PRIORITY_SEP = "\x06\x16"
_PRIORITY_STEPS = (0, 3, 6, 9)
_UNACKED = "unacked"


def celery_queue_names() -> list[str]:
    return [getattr(settings, "CELERY_TASK_DEFAULT_QUEUE", "celery")]


def metrics_allowed(request: HttpRequest) -> bool:
    """Open when the setting opens it; else to an admin (logged in, or by API
    token) or to a bearer of ``BAI_METRICS_TOKEN``."""
    if settings.BAI_METRICS_PUBLIC:
        return True
    header = request.headers.get("Authorization", "")
    scheme, _, credential = header.partition(" ")
    credential = credential.strip()
    if scheme.lower() == "bearer" and settings.BAI_METRICS_TOKEN and credential:
        return hmac.compare_digest(credential.encode(), settings.BAI_METRICS_TOKEN.encode())
    if scheme.lower() == "token" and credential:
        user = user_for_token(credential)
        return user is not None and user.is_staff
    return bool(request.user.is_authenticated and request.user.is_staff)


class ManagerCollector(Collector):
    """Everything ``/metrics`` shows, read afresh at each ``collect()``."""

    def __init__(self, client: redis.Redis | None = None) -> None:
        self.client = client

    def _redis(self) -> redis.Redis:
        if self.client is None:
            self.client = shared_redis.client(timeout=None)
        return self.client

    def collect(self) -> Iterator[Metric]:
        yield from self._database()
        client = self._redis()
        try:
            sums, held = shared.read(client)
            queues = self._queues(client)
        except redis.RedisError:
            up = GaugeMetricFamily("bai_redis_up", "Whether the scrape could read Redis")
            up.add_metric([], 0)
            yield up
            return
        yield from queues
        yield from self._shared(sums, held)

    def _database(self) -> Iterator[Metric]:
        pending = GaugeMetricFamily(
            "bai_sessions_pending",
            "Pending sessions per resource group, by the class of the reason they wait",
            labels=["group", "reason"],
        )
        counts: dict[tuple[str, str], int] = defaultdict(int)
        rows = (
            Session.objects.filter(status=Status.PENDING)
            .values_list("resource_group__name", "status_reason")
            .annotate(n=Count("id"))
        )
        for group, reason, n in rows:
            counts[(group, reason_class(reason))] += n
        for (group, why), n in sorted(counts.items()):
            pending.add_metric([group, why], n)
        yield pending

        sessions = GaugeMetricFamily(
            "bai_sessions",
            "Sessions not yet ended, per resource group and status",
            labels=["group", "status"],
        )
        rows = (
            Session.objects.filter(status__in=ACTIVE)
            .values_list("resource_group__name", "status")
            .annotate(n=Count("id"))
            .order_by()
        )
        for group, status, n in sorted(rows):
            sessions.add_metric([group, status], n)
        yield sessions

        kernels = GaugeMetricFamily(
            "bai_kernels", "Kernels not yet ended, per agent and status", labels=["agent", "status"]
        )
        rows = (
            Kernel.objects.filter(status__in=ACTIVE)
            .values_list("agent_id", "status")
            .annotate(n=Count("id"))
            .order_by()
        )
        for agent, status, n in sorted(rows, key=lambda r: (r[0] or "", r[1])):
            kernels.add_metric([agent or "", status], n)
        yield kernels

        agents = GaugeMetricFamily(
            "bai_agents",
            "Agents per resource group and status (ALIVE, LOST, TERMINATED)",
            labels=["group", "status"],
        )
        found = {
            (group, status): n
            for group, status, n in Agent.objects.values_list("resource_group__name", "status")
            .annotate(n=Count("id"))
            .order_by()
        }
        for group in {g for g, _ in found}:
            for status in AgentStatus.values:
                found.setdefault((group, status), 0)
        for (group, status), n in sorted(found.items()):
            agents.add_metric([group, status], n)
        yield agents

    def _queues(self, client: redis.Redis) -> list[Metric]:
        depth = GaugeMetricFamily(
            "bai_celery_queue_length",
            "Celery messages waiting in a queue (the broker's lists)",
            labels=["queue"],
        )
        pipe = client.pipeline(transaction=False)
        names = celery_queue_names()
        for name in names:
            for step in _PRIORITY_STEPS:
                pipe.llen(name if step == 0 else f"{name}{_PRIORITY_SEP}{step}")
        pipe.hlen(_UNACKED)
        lengths = pipe.execute()
        for i, name in enumerate(names):
            depth.add_metric([name], sum(lengths[i * 4 : i * 4 + 4]))
        unacked = GaugeMetricFamily(
            "bai_celery_unacked", "Celery messages handed to a worker and not yet acknowledged"
        )
        unacked.add_metric([], lengths[-1])
        return [depth, unacked]

    def _shared(self, sums: dict[str, float], held: dict[str, float]) -> Iterator[Metric]:
        by_name: dict[str, list[tuple[shared.Labels, float]]] = defaultdict(list)
        for source in (sums, held):
            for field, value in source.items():
                name, labels = shared.decode(field)
                by_name[name].append((labels, value))
        for name, metric in shared.METRICS.items():
            labels = list(metric.labels)
            if metric.kind == "counter":
                family: Any = CounterMetricFamily(name, metric.help, labels=labels)
                for values, value in sorted(by_name.get(name, [])):
                    family.add_metric([v for _, v in values], value)
            elif metric.kind == "gauge":
                family = GaugeMetricFamily(name, metric.help, labels=labels)
                for values, value in sorted(by_name.get(name, [])):
                    family.add_metric([v for _, v in values], value)
            else:
                family = HistogramMetricFamily(name, metric.help, labels=labels)
                for values, buckets, total in _histograms(name, by_name):
                    family.add_metric(list(values), buckets, total)
            yield family


def _histograms(
    name: str, by_name: dict[str, list[tuple[shared.Labels, float]]]
) -> Iterator[tuple[tuple[str, ...], list[tuple[str, float]], float]]:
    sums = {labels: value for labels, value in by_name.get(f"{name}_sum", [])}
    buckets: dict[tuple[tuple[str, str], ...], dict[str, float]] = defaultdict(dict)
    for labels, value in by_name.get(f"{name}_bucket", []):
        base = tuple(pair for pair in labels if pair[0] != "le")
        bound = dict(labels)["le"]
        buckets[base][bound] = value
    for base in sorted(buckets):
        bounds = buckets[base]
        ordered = [
            (le, bounds.get(le, 0.0))
            for le in [repr(b) for b in shared.METRICS[name].buckets] + ["+Inf"]
        ]
        yield tuple(v for _, v in base), ordered, sums.get(base, 0.0)
