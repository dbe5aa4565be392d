from django.urls import path

from . import consumers

# Full paths: this router sits behind the origin and login checks in asgi.py.
websocket_urlpatterns = [
    path("ws/sessions/", consumers.SessionsConsumer.as_asgi()),
]
