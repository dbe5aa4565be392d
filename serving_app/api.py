"""The endpoints' REST API: one view per operation, thin. Every path names an
endpoint its owner (or an admin) may see; anyone else gets 404 on every path."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from django.conf import settings
from drf_spectacular.utils import extend_schema, extend_schema_field, inline_serializer
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from sessions_app.api import MAX_LIST, QueryFlag, StrictInputSerializer, _query
from sessions_app.openapi import errors

from . import reconcile, selectors, services
from .models import (
    MAX_CLUSTER_SIZE,
    MAX_COOLDOWN,
    MAX_HEALTH_INTERVAL,
    MAX_PORT,
    MAX_REPLICAS,
    MAX_STEP,
    MIN_COOLDOWN,
    MIN_HEALTH_INTERVAL,
    MIN_PORT,
    AutoScalingRule,
    Comparator,
    Endpoint,
    EndpointEvent,
    EndpointToken,
    Metric,
    Route,
)

MAX_THRESHOLD = 1e9


def endpoint_url(endpoint: Endpoint) -> str:
    """The router's URL of the endpoint, on the apps origin's bare host."""
    return f"{settings.BAI_APPS_ORIGIN.rstrip('/')}/serve/{endpoint.name}/"


# --- output --------------------------------------------------------------------------


class EndpointRouteSerializer(serializers.ModelSerializer):
    session_id = serializers.UUIDField(allow_null=True)

    class Meta:
        model = Route
        fields = [
            "id",
            "session_id",
            "status",
            "traffic_ratio",
            "consecutive_failures",
            "health_reason",
            "created_at",
            "status_changed_at",
        ]


class EndpointRuleSerializer(serializers.ModelSerializer):
    class Meta:
        model = AutoScalingRule
        fields = [
            "id",
            "metric",
            "comparator",
            "threshold",
            "step",
            "cooldown",
            "min_replicas",
            "max_replicas",
            "last_triggered_at",
        ]


class EndpointSerializer(serializers.ModelSerializer):
    owner = serializers.CharField(source="owner.username")
    image = serializers.CharField(source="image.reference")
    resource_group = serializers.CharField(source="resource_group.name")
    model_folder = serializers.SerializerMethodField()
    url = serializers.SerializerMethodField()
    effective_start_command = serializers.SerializerMethodField(
        help_text="What replicas run: start_command, or the image's serving command when empty."
    )
    routes = EndpointRouteSerializer(many=True)
    rules = EndpointRuleSerializer(many=True)

    class Meta:
        model = Endpoint
        fields = [
            "id",
            "name",
            "owner",
            "image",
            "model_folder",
            "start_command",
            "effective_start_command",
            "port",
            "health_path",
            "health_interval",
            "resources",
            "cluster_size",
            "resource_group",
            "replicas",
            "min_replicas",
            "max_replicas",
            "open_to_public",
            "status",
            "status_reason",
            "url",
            "routes",
            "rules",
            "created_at",
            "last_request_at",
        ]

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_model_folder(self, obj: Endpoint) -> str | None:
        folder = obj.model_folder
        if folder is None:
            return None
        return folder.name if folder.owner_id == obj.owner_id else f"{folder.owner}/{folder.name}"

    def get_url(self, obj: Endpoint) -> str:
        return endpoint_url(obj)

    def get_effective_start_command(self, obj: Endpoint) -> str:
        return services.start_command_of(obj)


class EndpointEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = EndpointEvent
        fields = ["id", "created_at", "kind", "message", "data"]


class EndpointTokenSerializer(serializers.ModelSerializer):
    class Meta:
        model = EndpointToken
        fields = ["id", "prefix", "created_at", "expires_at"]


class EndpointNewTokenSerializer(EndpointTokenSerializer):
    token = serializers.CharField(help_text="The plain token: shown this once, never again.")

    class Meta(EndpointTokenSerializer.Meta):
        fields = EndpointTokenSerializer.Meta.fields + ["token"]


# --- input ---------------------------------------------------------------------------


def _replicas_field(**kwargs: Any) -> serializers.IntegerField:
    return serializers.IntegerField(min_value=0, max_value=MAX_REPLICAS, **kwargs)


class EndpointRuleInputSerializer(StrictInputSerializer):
    class Meta:
        ref_name = "AutoScalingRuleInput"

    metric = serializers.ChoiceField(choices=Metric.choices)
    comparator = serializers.ChoiceField(choices=Comparator.choices)
    threshold = serializers.FloatField(min_value=-MAX_THRESHOLD, max_value=MAX_THRESHOLD)
    step = serializers.IntegerField(
        min_value=-MAX_STEP, max_value=MAX_STEP, help_text="Not 0: positive adds replicas."
    )
    cooldown = serializers.IntegerField(
        min_value=MIN_COOLDOWN, max_value=MAX_COOLDOWN, required=False, help_text="Seconds."
    )
    min_replicas = _replicas_field(required=False)
    max_replicas = _replicas_field(required=False)


class SlotsField(serializers.DictField):
    """Per replica container, like a launch's ``resources`` (slot → amount)."""

    child = serializers.CharField(max_length=64)


class EndpointCreateSerializer(StrictInputSerializer):
    class Meta:
        ref_name = "EndpointCreateInput"

    name = serializers.RegexField(
        r"^[a-z0-9](?:[a-z0-9-]{0,62}[a-z0-9])?$",
        max_length=64,
        help_text="Lower-case letters, digits, '-': the URL /serve/<name>/ (unique over all users).",
        error_messages={
            "invalid": "use lower-case letters, digits and '-' (not first or last), up to 64: "
            "it becomes the URL /serve/<name>/"
        },
    )
    image = serializers.CharField(max_length=255)
    model_folder = serializers.CharField(
        max_length=129,
        required=False,
        allow_null=True,
        help_text="A folder of yours by name (or owner/name of one shared with you); "
        "mounted read-only at /home/work/<name>.",
    )
    start_command = serializers.CharField(
        max_length=2048,
        required=False,
        allow_blank=True,
        trim_whitespace=False,
        help_text="Empty: the image's serving command (refused if the image has none).",
    )
    port = serializers.IntegerField(min_value=MIN_PORT, max_value=MAX_PORT, required=False)
    health_path = serializers.CharField(max_length=255, required=False)
    health_interval = serializers.IntegerField(
        min_value=MIN_HEALTH_INTERVAL, max_value=MAX_HEALTH_INTERVAL, required=False
    )
    resources = SlotsField(required=False)
    cluster_size = serializers.IntegerField(min_value=1, max_value=MAX_CLUSTER_SIZE, required=False)
    resource_group = serializers.CharField(max_length=64, required=False)
    replicas = _replicas_field(required=False)
    min_replicas = _replicas_field(required=False)
    max_replicas = _replicas_field(required=False)
    open_to_public = serializers.BooleanField(required=False)
    rules = EndpointRuleInputSerializer(many=True, required=False)

    def validate_resources(self, value: dict[str, str]) -> dict[str, str]:
        if len(value) > 16:
            raise serializers.ValidationError("at most 16 slots")
        return value


class EndpointUpdateSerializer(StrictInputSerializer):
    class Meta:
        ref_name = "EndpointUpdateInput"

    replicas = _replicas_field(required=False)
    min_replicas = _replicas_field(required=False)
    max_replicas = _replicas_field(required=False)
    open_to_public = serializers.BooleanField(required=False)
    health_path = serializers.CharField(max_length=255, required=False)
    health_interval = serializers.IntegerField(
        min_value=MIN_HEALTH_INTERVAL, max_value=MAX_HEALTH_INTERVAL, required=False
    )
    rules = EndpointRuleInputSerializer(many=True, required=False, help_text="Replaces every rule.")


class ScaleSerializer(StrictInputSerializer):
    class Meta:
        ref_name = "EndpointScaleInput"

    replicas = _replicas_field()


class TokenInputSerializer(StrictInputSerializer):
    class Meta:
        ref_name = "EndpointTokenInput"

    expires_at = serializers.DateTimeField(required=False, allow_null=True)


# --- views ---------------------------------------------------------------------------


def _endpoint(request: Request, endpoint_id: str) -> Endpoint:
    return selectors.get_endpoint_for_user(user=request.user, endpoint_id=endpoint_id)


class EndpointListCreateApi(APIView):
    class QuerySerializer(serializers.Serializer):
        class Meta:
            ref_name = "EndpointListQuery"

        all = QueryFlag(required=False, default=False, help_text="Admins: every user's endpoints.")

    @extend_schema(parameters=[QuerySerializer], responses=EndpointSerializer(many=True))
    def get(self, request: Request) -> Response:
        query = _query(request, self.QuerySerializer)
        qs = selectors.endpoints_for_user(user=request.user, include_all=query["all"])
        return Response(EndpointSerializer(qs[:MAX_LIST], many=True).data)

    @extend_schema(
        request=EndpointCreateSerializer,
        responses={201: EndpointSerializer, **errors(403, 409)},
    )
    def post(self, request: Request) -> Response:
        data = EndpointCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        endpoint = services.endpoint_create(owner=request.user, data=data.validated_data)
        endpoint = _endpoint(request, endpoint.pk)
        return Response(EndpointSerializer(endpoint).data, status=status.HTTP_201_CREATED)


class EndpointQuotaApi(APIView):
    @extend_schema(
        responses=inline_serializer(
            "EndpointQuota",
            {
                "endpoint_count": serializers.IntegerField(),
                "max_endpoints": serializers.IntegerField(
                    allow_null=True, help_text="null: unlimited."
                ),
                "max_concurrent_sessions": serializers.IntegerField(
                    allow_null=True,
                    help_text="Replicas are your sessions: they count against this limit.",
                ),
                "max_pending_sessions": serializers.IntegerField(
                    allow_null=True,
                    help_text="Replicas are your sessions: they count against this limit.",
                ),
            },
        )
    )
    def get(self, request: Request) -> Response:
        """The caller's serving quota: endpoints owned and allowed, and the session limits
        their replicas count against (nulls: unlimited)."""
        return Response(asdict(selectors.endpoint_quota(user=request.user)))


class EndpointDetailApi(APIView):
    @extend_schema(responses=EndpointSerializer)
    def get(self, request: Request, endpoint_id: str) -> Response:
        return Response(EndpointSerializer(_endpoint(request, endpoint_id)).data)

    @extend_schema(
        request=EndpointUpdateSerializer, responses={200: EndpointSerializer, **errors(409)}
    )
    def patch(self, request: Request, endpoint_id: str) -> Response:
        endpoint = _endpoint(request, endpoint_id)
        data = EndpointUpdateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        services.endpoint_update(endpoint=endpoint, user=request.user, data=data.validated_data)
        return Response(EndpointSerializer(_endpoint(request, endpoint_id)).data)

    @extend_schema(responses={204: None})
    def delete(self, request: Request, endpoint_id: str) -> Response:
        services.endpoint_delete(endpoint=_endpoint(request, endpoint_id), user=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)


class EndpointScaleApi(APIView):
    @extend_schema(request=ScaleSerializer, responses={200: EndpointSerializer, **errors(409)})
    def post(self, request: Request, endpoint_id: str) -> Response:
        endpoint = _endpoint(request, endpoint_id)
        data = ScaleSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        services.endpoint_scale(
            endpoint=endpoint, user=request.user, replicas=data.validated_data["replicas"]
        )
        return Response(EndpointSerializer(_endpoint(request, endpoint_id)).data)


class EndpointRoutesApi(APIView):
    @extend_schema(responses=EndpointRouteSerializer(many=True))
    def get(self, request: Request, endpoint_id: str) -> Response:
        endpoint = _endpoint(request, endpoint_id)
        return Response(EndpointRouteSerializer(endpoint.routes.order_by("id"), many=True).data)


class EndpointHistoryApi(APIView):
    @extend_schema(responses=EndpointEventSerializer(many=True))
    def get(self, request: Request, endpoint_id: str) -> Response:
        endpoint = _endpoint(request, endpoint_id)
        events = selectors.endpoint_history(endpoint=endpoint)
        return Response(EndpointEventSerializer(events, many=True).data)


class EndpointMetricsApi(APIView):
    @extend_schema(
        responses=inline_serializer(
            "EndpointMetrics",
            {
                "snapshot": serializers.DictField(
                    allow_null=True,
                    help_text='The last 30 s: {"rps", "p95_ms", "inflight", "routes": {...}}; '
                    "null when no metrics are kept.",
                ),
                "series": serializers.ListField(
                    child=serializers.DictField(), help_text='[{"t", "rps", "p95_ms"}], 5 min.'
                ),
            },
        )
    )
    def get(self, request: Request, endpoint_id: str) -> Response:
        endpoint = _endpoint(request, endpoint_id)
        return Response(
            {
                "snapshot": reconcile.snapshot(str(endpoint.pk)),
                "series": reconcile.series(str(endpoint.pk)),
            }
        )


class EndpointTokensApi(APIView):
    @extend_schema(responses=EndpointTokenSerializer(many=True))
    def get(self, request: Request, endpoint_id: str) -> Response:
        endpoint = _endpoint(request, endpoint_id)
        return Response(EndpointTokenSerializer(endpoint.tokens.order_by("id"), many=True).data)

    @extend_schema(
        request=TokenInputSerializer, responses={201: EndpointNewTokenSerializer, **errors(409)}
    )
    def post(self, request: Request, endpoint_id: str) -> Response:
        endpoint = _endpoint(request, endpoint_id)
        data = TokenInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        token, plain = services.token_create(
            endpoint=endpoint, user=request.user, expires_at=data.validated_data.get("expires_at")
        )
        body = {**EndpointTokenSerializer(token).data, "token": plain}
        return Response(body, status=status.HTTP_201_CREATED)


class EndpointTokenDeleteApi(APIView):
    @extend_schema(responses={204: None})
    def delete(self, request: Request, endpoint_id: str, token_id: int) -> Response:
        services.token_delete(
            endpoint=_endpoint(request, endpoint_id), user=request.user, token_id=token_id
        )
        return Response(status=status.HTTP_204_NO_CONTENT)


class EndpointRulesApi(APIView):
    @extend_schema(responses=EndpointRuleSerializer(many=True))
    def get(self, request: Request, endpoint_id: str) -> Response:
        endpoint = _endpoint(request, endpoint_id)
        return Response(EndpointRuleSerializer(endpoint.rules.order_by("id"), many=True).data)

    @extend_schema(
        request=EndpointRuleInputSerializer, responses={201: EndpointRuleSerializer, **errors(409)}
    )
    def post(self, request: Request, endpoint_id: str) -> Response:
        endpoint = _endpoint(request, endpoint_id)
        data = EndpointRuleInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        rule = services.rule_create(endpoint=endpoint, data=data.validated_data)
        return Response(EndpointRuleSerializer(rule).data, status=status.HTTP_201_CREATED)


class EndpointRuleDeleteApi(APIView):
    @extend_schema(responses={204: None})
    def delete(self, request: Request, endpoint_id: str, rule_id: int) -> Response:
        services.rule_delete(endpoint=_endpoint(request, endpoint_id), rule_id=rule_id)
        return Response(status=status.HTTP_204_NO_CONTENT)
