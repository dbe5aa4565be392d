"""Django admin for endpoints, their routes, tokens, rules and history.

Tokens are never created here (their plain text is shown once, by the API);
history is read-only.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from .models import AutoScalingRule, Endpoint, EndpointEvent, EndpointToken, Route


class RouteInline(admin.TabularInline):
    model = Route
    extra = 0
    fields = ["session", "status", "traffic_ratio", "consecutive_failures", "status_changed_at"]
    readonly_fields = ["session", "status", "consecutive_failures", "status_changed_at"]
    can_delete = False


class RuleInline(admin.TabularInline):
    model = AutoScalingRule
    extra = 0
    fields = [
        "metric",
        "comparator",
        "threshold",
        "step",
        "cooldown",
        "min_replicas",
        "max_replicas",
        "last_triggered_at",
    ]
    readonly_fields = ["last_triggered_at"]


@admin.register(Endpoint)
class EndpointAdmin(admin.ModelAdmin):
    list_display = ["name", "owner", "image", "status", "replicas", "min_replicas", "max_replicas"]
    list_filter = ["status", "open_to_public", "resource_group"]
    search_fields = ["name", "owner__username"]
    readonly_fields = [
        "id",
        "status",
        "status_reason",
        "created_at",
        "last_request_at",
        "scaled_at",
    ]
    list_select_related = ["owner", "image"]
    inlines = [RouteInline, RuleInline]


@admin.register(Route)
class RouteAdmin(admin.ModelAdmin):
    list_display = ["id", "endpoint", "session", "status", "traffic_ratio", "status_changed_at"]
    list_filter = ["status"]
    search_fields = ["endpoint__name"]
    readonly_fields = ["endpoint", "session", "status", "created_at", "status_changed_at"]
    list_select_related = ["endpoint", "session"]


@admin.register(EndpointToken)
class EndpointTokenAdmin(admin.ModelAdmin):
    list_display = ["prefix", "endpoint", "created_by", "created_at", "expires_at"]
    search_fields = ["endpoint__name", "prefix"]
    fields = ["endpoint", "prefix", "created_by", "created_at", "expires_at"]
    readonly_fields = ["endpoint", "prefix", "created_by", "created_at"]
    list_select_related = ["endpoint", "created_by"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


@admin.register(AutoScalingRule)
class AutoScalingRuleAdmin(admin.ModelAdmin):
    list_display = ["endpoint", "metric", "comparator", "threshold", "step", "cooldown"]
    list_filter = ["metric"]
    search_fields = ["endpoint__name"]
    readonly_fields = ["last_triggered_at"]


@admin.register(EndpointEvent)
class EndpointEventAdmin(admin.ModelAdmin):
    list_display = ["created_at", "endpoint", "kind", "message"]
    list_filter = ["kind"]
    search_fields = ["endpoint__name", "message"]
    list_select_related = ["endpoint"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
