"""Inference endpoints: an endpoint wants ``replicas`` replica sessions (routes);
the reconciler (``reconcile.py``) creates and removes them through
``sessions_app.services`` and checks their health. Every scale, failure and health
change is an EndpointEvent with its reason (and the metric value behind it).

Field names are fixed by the serving contract: the router reads them.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.conf import settings
from django.db import models, transaction
from django.db.models import Q
from django.utils import timezone

MAX_REPLICAS = 16
MAX_CLUSTER_SIZE = 8
MIN_PORT, MAX_PORT = 1024, 65535
MIN_HEALTH_INTERVAL, MAX_HEALTH_INTERVAL = 1, 300
MIN_COOLDOWN, MAX_COOLDOWN = 1, 86400
MAX_STEP = 16


class EndpointStatus(models.TextChoices):
    READY = "READY"
    DEGRADED = "DEGRADED"
    PROVISIONING = "PROVISIONING"
    SCALED_TO_ZERO = "SCALED_TO_ZERO"
    DESTROYING = "DESTROYING"


class RouteStatus(models.TextChoices):
    PROVISIONING = "PROVISIONING"
    HEALTHY = "HEALTHY"
    UNHEALTHY = "UNHEALTHY"
    TERMINATING = "TERMINATING"
    FAILED_TO_START = "FAILED_TO_START"


R = RouteStatus
# Routes that stand for a replica the endpoint counts (not yet ending).
LIVE_ROUTES = frozenset({R.PROVISIONING, R.HEALTHY, R.UNHEALTHY})
ROUTE_TRANSITIONS: dict[str, frozenset[str]] = {
    R.PROVISIONING: frozenset({R.HEALTHY, R.UNHEALTHY, R.TERMINATING, R.FAILED_TO_START}),
    R.HEALTHY: frozenset({R.UNHEALTHY, R.TERMINATING}),
    R.UNHEALTHY: frozenset({R.HEALTHY, R.TERMINATING}),
    R.TERMINATING: frozenset(),
    R.FAILED_TO_START: frozenset(),
}


class Metric(models.TextChoices):
    RPS_PER_REPLICA = "rps_per_replica"
    P95_LATENCY_MS = "p95_latency_ms"
    INFLIGHT = "inflight"
    CPU_UTIL = "cpu_util"


class Comparator(models.TextChoices):
    GT = "gt"
    GE = "ge"
    LT = "lt"
    LE = "le"


class EventKind(models.TextChoices):
    SCALE = "scale"
    HEALTH = "health"
    FAILURE = "failure"
    CREATED = "created"
    DELETED = "deleted"
    TOKEN = "token"


class Endpoint(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="endpoints"
    )
    # The URL: /serve/<name>/ on the apps origin, so unique over all users.
    name = models.SlugField(max_length=64, unique=True)
    image = models.ForeignKey("sessions_app.Image", on_delete=models.PROTECT, related_name="+")
    model_folder = models.ForeignKey(
        "sessions_app.DataFolder",
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="endpoints",
        help_text="Mounted read-only at /home/work/<folder name>; BAI_MODEL_DIR points there.",
    )
    start_command = models.TextField(blank=True)
    port = models.PositiveIntegerField(default=8000)
    health_path = models.CharField(max_length=255, default="/health")
    health_interval = models.PositiveIntegerField(default=5, help_text="Seconds.")
    resources = models.JSONField(default=dict, blank=True, help_text="Per replica container.")
    cluster_size = models.PositiveIntegerField(default=1)
    resource_group = models.ForeignKey(
        "sessions_app.ResourceGroup", on_delete=models.PROTECT, related_name="+"
    )
    replicas = models.PositiveIntegerField(default=1, help_text="Desired.")
    min_replicas = models.PositiveIntegerField(default=0)
    max_replicas = models.PositiveIntegerField(default=MAX_REPLICAS)
    open_to_public = models.BooleanField(default=False, help_text="False: callers need a token.")
    status = models.CharField(
        max_length=16, choices=EndpointStatus.choices, default=EndpointStatus.PROVISIONING
    )
    status_reason = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    last_request_at = models.DateTimeField(null=True, blank=True)
    # When the replica count last went from >0 to 0 or back; the idle clock of scale to zero
    # starts at the later of this and last_request_at.
    scaled_at = models.DateTimeField(default=timezone.now)
    # Replica starts failed in a row; past BAI_SERVE_MAX_START_RETRIES the endpoint is
    # DEGRADED and stops trying until its owner changes it.
    start_failures = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=Q(port__gte=MIN_PORT, port__lte=MAX_PORT), name="endpoint_port_range"
            ),
            models.CheckConstraint(
                condition=Q(
                    health_interval__gte=MIN_HEALTH_INTERVAL,
                    health_interval__lte=MAX_HEALTH_INTERVAL,
                ),
                name="endpoint_health_interval_range",
            ),
            models.CheckConstraint(
                condition=Q(cluster_size__gte=1, cluster_size__lte=MAX_CLUSTER_SIZE),
                name="endpoint_cluster_size_range",
            ),
            models.CheckConstraint(
                condition=Q(max_replicas__lte=MAX_REPLICAS)
                & Q(min_replicas__lte=models.F("max_replicas"))
                & Q(replicas__lte=models.F("max_replicas")),
                name="endpoint_replicas_within_bounds",
            ),
            models.CheckConstraint(
                condition=Q(status__in=[s.value for s in EndpointStatus]),
                name="endpoint_status_valid",
            ),
        ]

    def __str__(self) -> str:
        return self.name


class Route(models.Model):
    """One replica session of an endpoint."""

    endpoint = models.ForeignKey(Endpoint, on_delete=models.CASCADE, related_name="routes")
    session = models.ForeignKey(
        "sessions_app.Session",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="serving_routes",
    )
    status = models.CharField(max_length=16, choices=RouteStatus.choices, default=R.PROVISIONING)
    traffic_ratio = models.FloatField(default=1.0)
    created_at = models.DateTimeField(default=timezone.now)
    status_changed_at = models.DateTimeField(default=timezone.now)
    consecutive_failures = models.PositiveIntegerField(default=0)
    last_checked_at = models.DateTimeField(null=True, blank=True)
    health_reason = models.CharField(max_length=300, blank=True, help_text="The last failed check.")

    class Meta:
        ordering = ["endpoint", "id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(traffic_ratio__gt=0, traffic_ratio__lte=1),
                name="route_traffic_ratio_range",
            ),
            models.CheckConstraint(
                condition=Q(status__in=[s.value for s in RouteStatus]), name="route_status_valid"
            ),
        ]

    def __str__(self) -> str:
        return f"route {self.pk} of {self.endpoint_id} ({self.status})"

    def transition(self, dst: str, **fields: Any) -> bool:
        """Move to ``dst`` if the table allows it and nobody moved first (compare-and-swap)."""
        src = self.status
        if dst not in ROUTE_TRANSITIONS[src]:
            raise ValueError(f"illegal route transition {src} → {dst} for route {self.pk}")
        values = {"status": dst, "status_changed_at": timezone.now(), **fields}
        won = Route.objects.filter(pk=self.pk, status=src).update(**values) == 1
        if won:
            for key, value in values.items():
                setattr(self, key, value)
        return won


class EndpointToken(models.Model):
    """A caller's bearer token; only its SHA-256 is kept (the plain token is shown once)."""

    endpoint = models.ForeignKey(Endpoint, on_delete=models.CASCADE, related_name="tokens")
    prefix = models.CharField(max_length=8)
    digest = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+"
    )

    class Meta:
        ordering = ["endpoint", "created_at", "id"]

    def __str__(self) -> str:
        return f"{self.prefix}… of {self.endpoint_id}"


class AutoScalingRule(models.Model):
    endpoint = models.ForeignKey(Endpoint, on_delete=models.CASCADE, related_name="rules")
    metric = models.CharField(max_length=32, choices=Metric.choices)
    comparator = models.CharField(max_length=2, choices=Comparator.choices)
    threshold = models.FloatField()
    step = models.IntegerField(help_text="Replicas to add (positive) or remove (negative).")
    cooldown = models.PositiveIntegerField(default=60, help_text="Seconds.")
    min_replicas = models.PositiveIntegerField(default=0)
    max_replicas = models.PositiveIntegerField(default=MAX_REPLICAS)
    last_triggered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["endpoint", "id"]
        constraints = [
            models.CheckConstraint(
                condition=~Q(step=0) & Q(step__gte=-MAX_STEP, step__lte=MAX_STEP),
                name="rule_step_range",
            ),
            models.CheckConstraint(
                condition=Q(cooldown__gte=MIN_COOLDOWN, cooldown__lte=MAX_COOLDOWN),
                name="rule_cooldown_range",
            ),
            models.CheckConstraint(
                condition=Q(max_replicas__lte=MAX_REPLICAS)
                & Q(min_replicas__lte=models.F("max_replicas")),
                name="rule_replicas_within_bounds",
            ),
            models.CheckConstraint(
                condition=Q(metric__in=[m.value for m in Metric]), name="rule_metric_valid"
            ),
            models.CheckConstraint(
                condition=Q(comparator__in=[c.value for c in Comparator]),
                name="rule_comparator_valid",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.metric} {self.comparator} {self.threshold:g} → {self.step:+d}"


class EndpointEvent(models.Model):
    """The endpoint's history: append-only."""

    endpoint = models.ForeignKey(Endpoint, on_delete=models.CASCADE, related_name="events")
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    kind = models.CharField(max_length=16, choices=EventKind.choices)
    message = models.TextField()
    data = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"


def record(endpoint: Endpoint | Any, kind: str, message: str, **data: Any) -> EndpointEvent:
    """Append a history row (the one writer of EndpointEvent)."""
    endpoint_id = endpoint.pk if isinstance(endpoint, Endpoint) else endpoint
    with transaction.atomic():
        return EndpointEvent.objects.create(
            endpoint_id=endpoint_id, kind=kind, message=message[:2000], data=data
        )
