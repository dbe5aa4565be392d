from django.urls import path

from . import consumers

# Relative to the ``ws/`` prefix under which asgi.py mounts this router, behind
# the origin and login checks: these serve /ws/sessions/…
websocket_urlpatterns = [
    path("sessions/", consumers.SessionsConsumer.as_asgi()),
    path(
        "sessions/<str:session_id>/kernels/<str:kernel_ref>/logs/",
        consumers.KernelLogsConsumer.as_asgi(),
    ),
    path("sessions/<str:session_id>/terminal/", consumers.TerminalConsumer.as_asgi()),
    path("sessions/<str:session_id>/execute/", consumers.ExecuteConsumer.as_asgi()),
]
