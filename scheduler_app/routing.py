from django.urls import path

from .consumers import AgentGatewayConsumer

websocket_urlpatterns = [
    path("ws/agent/", AgentGatewayConsumer.as_asgi()),
]
