
websocket_urlpatterns: list = [
    # path("ws/agent/", AgentGatewayConsumer.as_asgi()) -- added with the gateway
]
