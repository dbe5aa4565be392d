"""ASGI entry point: HTTP through Django, websockets through Channels.

Browser websockets (sessions_app) are checked for origin and login: the
Origin must be this very site, host and port (see ``SameOriginValidator``:
channels' ``AllowedHostsOriginValidator`` ignores the port, so any other page
on localhost would pass). The agent gateway (scheduler_app) authenticates
agents by token itself, since agents are not browsers and send no Origin.
"""

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "backendai_web.settings")
django.setup(set_prefix=False)

from backendai_web.uploads import StreamingBodyHandler  # noqa: E402

# get_asgi_application(), with the middleware run in one thread hop (handler.py) and
# uploads' bodies read as the view reads them (uploads.py).
django_asgi_app = StreamingBodyHandler()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.urls import re_path  # noqa: E402

from scheduler_app.consumers import start_listening_beacon  # noqa: E402
from scheduler_app.routing import websocket_urlpatterns as agent_patterns  # noqa: E402
from sessions_app.auth import SameOriginValidator, TokenAuthMiddleware  # noqa: E402
from sessions_app.routing import websocket_urlpatterns as browser_patterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": URLRouter(
            [
                *agent_patterns,
                re_path(
                    r"^ws/",
                    SameOriginValidator(
                        AuthMiddlewareStack(TokenAuthMiddleware(URLRouter(browser_patterns)))
                    ),
                ),
            ]
        ),
    }
)

# This process serves the agent gateway: the lost-agent sweep counts agents'
# silence only while some gateway listens (scheduler_app.reconcile).
start_listening_beacon()
