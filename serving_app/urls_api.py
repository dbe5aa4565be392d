from django.urls import path

from . import api

urlpatterns = [
    path("endpoints/", api.EndpointListCreateApi.as_view(), name="api-endpoints"),
    path("endpoints/quota/", api.EndpointQuotaApi.as_view(), name="api-endpoint-quota"),
    path("endpoints/<str:endpoint_id>/", api.EndpointDetailApi.as_view(), name="api-endpoint"),
    path(
        "endpoints/<str:endpoint_id>/scale/",
        api.EndpointScaleApi.as_view(),
        name="api-endpoint-scale",
    ),
    path(
        "endpoints/<str:endpoint_id>/routes/",
        api.EndpointRoutesApi.as_view(),
        name="api-endpoint-routes",
    ),
    path(
        "endpoints/<str:endpoint_id>/history/",
        api.EndpointHistoryApi.as_view(),
        name="api-endpoint-history",
    ),
    path(
        "endpoints/<str:endpoint_id>/metrics/",
        api.EndpointMetricsApi.as_view(),
        name="api-endpoint-metrics",
    ),
    path(
        "endpoints/<str:endpoint_id>/tokens/",
        api.EndpointTokensApi.as_view(),
        name="api-endpoint-tokens",
    ),
    path(
        "endpoints/<str:endpoint_id>/tokens/<int:token_id>/",
        api.EndpointTokenDeleteApi.as_view(),
        name="api-endpoint-token",
    ),
    path(
        "endpoints/<str:endpoint_id>/rules/",
        api.EndpointRulesApi.as_view(),
        name="api-endpoint-rules",
    ),
    path(
        "endpoints/<str:endpoint_id>/rules/<int:rule_id>/",
        api.EndpointRuleDeleteApi.as_view(),
        name="api-endpoint-rule",
    ),
]
