from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from sessions_app.views import favicon, healthz, metrics_page

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path(
        "api/docs/",
        # Our own page around Swagger UI: a language and a main landmark (accessibility).
        SpectacularSwaggerSplitView.as_view(url_name="api-schema", template_name="api_docs.html"),
        name="api-docs",
    ),
    path("api/v1/", include("sessions_app.urls_api")),
    path("serving/", include("serving_app.pages")),
    path("api/v1/", include("serving_app.urls_api")),
    path("metrics", metrics_page, name="metrics"),
    path("healthz", healthz, name="healthz"),
    # Browsers ask for it on pages without an icon link (the API's JSON, a file download).
    path("favicon.ico", favicon, name="favicon"),
    path("", include("sessions_app.urls")),
]

# Under /api/ an error is the API's JSON, even where no API view was reached.
handler400 = "sessions_app.views.bad_request"
handler404 = "sessions_app.views.page_not_found"
handler500 = "sessions_app.views.server_error"
