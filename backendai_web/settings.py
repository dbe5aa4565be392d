"""One settings module; every value comes from the environment (see env.py).

The defaults give a working checkout that is safe to run: SQLite in ./var, a
Redis on loopback (the run command starts an embedded one), DEBUG off, a
secret key generated once into var/secret_key, and only loopback host names.
Debug pages are an explicit opt-in (BAI_DEBUG=1) that the run command never
uses. Production sets BAI_PRODUCTION=true, which requires SECRET_KEY, the
database URL and ALLOWED_HOSTS, and enables the secure-cookie/HSTS settings
that `manage.py check --deploy` asks for.
"""

import re
from datetime import timedelta
from pathlib import Path

import dj_database_url
from csp.constants import NONE, SELF, UNSAFE_INLINE
from django.core.exceptions import ImproperlyConfigured

from agent import protocol

from .env import (
    env_bool,
    env_float,
    env_int,
    env_list,
    env_str,
    persistent_secret,
    redis_password,
)

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("BAI_VAR_DIR", str(BASE_DIR / "var")))

PRODUCTION = env_bool("BAI_PRODUCTION", False)
# Debug pages show every setting (the database password too) to whoever makes
# a request crash: only ever by an explicit opt-in, never in production.
DEBUG = env_bool("BAI_DEBUG", False)
if DEBUG and PRODUCTION:
    raise ImproperlyConfigured("BAI_DEBUG must not be set when BAI_PRODUCTION=true")
# Even then, error reports hide every URL, host and location that may carry a password.
DEFAULT_EXCEPTION_REPORTER_FILTER = "sessions_app.errors.SettingsReporterFilter"

SECRET_KEY = env_str("SECRET_KEY", "")
if not SECRET_KEY:
    if PRODUCTION:
        raise ImproperlyConfigured("SECRET_KEY must be set when BAI_PRODUCTION=true")
    SECRET_KEY = persistent_secret(VAR_DIR / "secret_key")

# The address the run command serves on; its name is an allowed host too.
BAI_HOST = env_str("BAI_HOST", "127.0.0.1")
_LOOPBACK_HOSTS = ["localhost", "127.0.0.1", "[::1]"]
_bind_host = f"[{BAI_HOST}]" if ":" in BAI_HOST else BAI_HOST
# A wildcard bind address names no host: say which names to allow in ALLOWED_HOSTS.
_bind_names = [] if _bind_host in ("", "0.0.0.0", "[::]", *_LOOPBACK_HOSTS) else [_bind_host]
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", [] if PRODUCTION else _LOOPBACK_HOSTS + _bind_names)
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "knox",
    "axes",
    "csp",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "sessions_app",
    "scheduler_app",
    "serving_app",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "csp.middleware.CSPMiddleware",
    "sessions_app.middleware.BodySizeLimitMiddleware",
    "sessions_app.middleware.JsonDepthLimitMiddleware",
    "sessions_app.middleware.NulQueryMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last, as axes asks: it turns a locked-out login into the lockout page.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "backendai_web.urls"
ASGI_APPLICATION = "backendai_web.asgi.application"
WSGI_APPLICATION = None

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

_default_db = f"sqlite:///{VAR_DIR / 'db.sqlite3'}"
DATABASE_URL = env_str("DATABASE_URL", "" if PRODUCTION else _default_db)
if not DATABASE_URL:
    raise ImproperlyConfigured("DATABASE_URL must be set when BAI_PRODUCTION=true")
DATABASES = {
    "default": dj_database_url.parse(DATABASE_URL, conn_max_age=0, conn_health_checks=True)
}
BAI_DB_POOL_MIN = env_int("BAI_DB_POOL_MIN", 2, minimum=0)
BAI_DB_POOL_MAX = env_int("BAI_DB_POOL_MAX", 10, minimum=1)
BAI_DB_POOL_TIMEOUT = env_float("BAI_DB_POOL_TIMEOUT", 30.0, minimum=0.1)
if BAI_DB_POOL_MIN > BAI_DB_POOL_MAX:
    raise ImproperlyConfigured(
        f"BAI_DB_POOL_MIN={BAI_DB_POOL_MIN} is above BAI_DB_POOL_MAX={BAI_DB_POOL_MAX}"
    )
DATABASES["default"].setdefault("OPTIONS", {})
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    # One bounded pool per process. Without it every thread that touched the
    # database (daphne runs each request in a thread of its own) kept its own
    # connection: a burst of API clients exhausted PostgreSQL's connections.
    # A request waits up to the timeout for a free connection instead.
    # CONN_MAX_AGE stays 0: a connection goes back to the pool after each use.
    # With CONN_HEALTH_CHECKS the pool replaces a connection the server closed
    # (a restart) instead of handing it out; it asks the server only when it has
    # a reason to (backendai_web/db.py, installed by sessions_app).
    DATABASES["default"]["OPTIONS"]["pool"] = {
        "min_size": BAI_DB_POOL_MIN,
        "max_size": BAI_DB_POOL_MAX,
        "timeout": BAI_DB_POOL_TIMEOUT,
    }
elif DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    VAR_DIR.mkdir(parents=True, exist_ok=True)
    # Several processes (daphne, celery worker and beat) share the embedded
    # database file: wait for the write lock instead of failing at once.
    DATABASES["default"]["OPTIONS"].update(
        {"timeout": 20, "transaction_mode": "IMMEDIATE", "init_command": "PRAGMA journal_mode=WAL;"}
    )

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
AUTHENTICATION_BACKENDS = [
    # First: refuses a locked-out login before any password is checked.
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "staticfiles"
STATICFILES_DIRS = [
    BASE_DIR / "static",
    # xterm.js and its fit addon come from npm (package.json), never committed.
    ("vendor/xterm", BASE_DIR / "node_modules" / "@xterm"),
    # uPlot draws the Serving page's charts.
    ("vendor/uplot", BASE_DIR / "node_modules" / "uplot" / "dist"),
]
# axe-core (an npm devDependency) is what the e2e tests inject into every page
# they visit to check its accessibility: served like xterm, from our own origin,
# because the pages' CSP allows scripts from nowhere else. An install without
# devDependencies simply does not serve it.
if (BASE_DIR / "node_modules" / "axe-core").is_dir():
    STATICFILES_DIRS.append(("vendor/axe-core", BASE_DIR / "node_modules" / "axe-core"))
# whitenoise serves static files with DEBUG off too, straight from the finders
# (static/, the apps', node_modules' xterm): a checkout needs no collectstatic.
WHITENOISE_USE_FINDERS = True
if not PRODUCTION:
    STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # empty; whitenoise warns if it is missing
WHITENOISE_AUTOREFRESH = DEBUG
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "session-list"
LOGOUT_REDIRECT_URL = "login"

# Request bodies above this size are refused with 413 (the API says so).
DATA_UPLOAD_MAX_MEMORY_SIZE = env_int("BAI_MAX_BODY_BYTES", 256 * 1024, minimum=1024)
# JSON bodies nested deeper than this are refused with 400 before anything parses them.
BAI_MAX_JSON_DEPTH = env_int("BAI_MAX_JSON_DEPTH", 64, minimum=2)

REDIS_URL = env_str("REDIS_URL", "" if PRODUCTION else "redis://127.0.0.1:6379/0")
# Redis carries the channel layer (what agents are told to run) and the broker: in
# production it must ask for a password (redis://:PASSWORD@host:port/0). The run
# command's embedded Redis has one, made once into var/redis_password.
if PRODUCTION and not redis_password(REDIS_URL):
    raise ImproperlyConfigured(
        "REDIS_URL must be set and carry a password (redis://:PASSWORD@HOST:PORT/0)"
        " when BAI_PRODUCTION=true"
    )
CHANNEL_LAYERS = {
    "default": {
        # The pub/sub layer: one hop p50 ~0.24 ms against ~1.5 ms for the
        # list-based layer, and the terminal path crosses the layer twice.
        # Ours keeps a send() to a channel of the same process local (no Redis).
        "BACKEND": "backendai_web.channel_layer.LocalFirstPubSubChannelLayer",
        "CONFIG": {"hosts": [REDIS_URL], "prefix": env_str("BAI_CHANNEL_PREFIX", "bai")},
    }
}

# Shared by every process: the API's login-failure counters live here.
CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": env_str("BAI_CACHE_PREFIX", "bai"),
    }
}

CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BEAT_SCHEDULE = {
    "schedule-all-groups": {"task": "scheduler_app.tasks.schedule_all", "schedule": 5.0},
    "sweep-lost-agents": {"task": "scheduler_app.tasks.sweep_lost_agents", "schedule": 5.0},
    "sweep-timeouts": {"task": "scheduler_app.tasks.sweep_timeouts", "schedule": 10.0},
    # Kernels' writes to data folders, measured after the fact (no filesystem quota here).
    "sweep-folder-usage": {
        "task": "scheduler_app.tasks.sweep_folder_usage",
        "schedule": float(env_int("BAI_FOLDER_MEASURE_INTERVAL", 60, minimum=5, maximum=86400)),
    },
    "reconcile-endpoints": {
        "task": "serving_app.tasks.reconcile_endpoints",
        "schedule": float(env_int("BAI_SERVE_RECONCILE_INTERVAL", 3, minimum=1)),
    },
}

# --- inference endpoints (serving_app) ---------------------------------------
# A replica whose session fails to start is retried this many times in a row,
# then the endpoint is DEGRADED with the reason.
BAI_SERVE_MAX_START_RETRIES = env_int("BAI_SERVE_MAX_START_RETRIES", 3, minimum=0)
# Health checks failed in a row before a route is UNHEALTHY (and, after as many
# more, replaced).
BAI_SERVE_UNHEALTHY_AFTER = env_int("BAI_SERVE_UNHEALTHY_AFTER", 2, minimum=1)
# Seconds one health check may take (through the apps proxy's tunnel).
BAI_SERVE_HEALTH_TIMEOUT = env_int("BAI_SERVE_HEALTH_TIMEOUT", 2, minimum=1)
# An endpoint with min_replicas 0 and no request for this long scales to zero.
BAI_SERVE_IDLE_TIMEOUT = env_int("BAI_SERVE_IDLE_TIMEOUT", 300, minimum=1)
# A replica whose session runs but has not passed a health check this long after
# it started has failed to start.
BAI_SERVE_START_TIMEOUT = env_int("BAI_SERVE_START_TIMEOUT", 180, minimum=1)
# Where the reconciler reaches the apps proxy for health checks (default: the
# http form of BAI_APPS_TUNNEL_URL).
BAI_SERVE_PROBE_URL = env_str("BAI_SERVE_PROBE_URL", "")
# Seconds of the router's metrics the autoscaling rules and scale to zero look at.
BAI_SERVE_METRICS_WINDOW = env_int("BAI_SERVE_METRICS_WINDOW", 30, minimum=1, maximum=60)

# --- login, tokens, content security policy --------------------------------
# Failed logins per user name and client address before that pair is refused
# for the cool-off: the login pages through django-axes, the token endpoint
# through a DRF throttle (which also refuses an address after ten times as
# many failures over any user names).
BAI_LOGIN_FAILURE_LIMIT = env_int("BAI_LOGIN_FAILURE_LIMIT", 5, minimum=1)
BAI_LOGIN_COOLOFF = env_int("BAI_LOGIN_COOLOFF", 300, minimum=1)
AXES_FAILURE_LIMIT = BAI_LOGIN_FAILURE_LIMIT
AXES_COOLOFF_TIME = timedelta(seconds=BAI_LOGIN_COOLOFF)
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
# Attempts during a lockout do not extend it, so the page can say when it ends.
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
AXES_LOCKOUT_CALLABLE = "sessions_app.auth.login_lockout_response"
AXES_WHITELIST_CALLABLE = "sessions_app.auth.axes_leaves_to_api_throttle"
AXES_VERBOSE = False  # no banner on every start; lockouts are still logged

# API tokens (django-rest-knox): stored hashed, sent as `Authorization: Token <token>`.
BAI_TOKEN_TTL = env_int("BAI_TOKEN_TTL", 7 * 24 * 3600, minimum=60)
REST_KNOX = {"TOKEN_TTL": timedelta(seconds=BAI_TOKEN_TTL), "AUTH_HEADER_PREFIX": "Token"}

# No inline script anywhere and nothing from another host. Styles may be
# inline: xterm.js and Swagger UI insert <style> elements as they render.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF],
        "style-src": [SELF, UNSAFE_INLINE],
        "img-src": [SELF, "data:"],
        "font-src": [SELF, "data:"],
        "connect-src": [SELF],
        "object-src": [NONE],
        "base-uri": [NONE],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
    }
}

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "sessions_app.tokens.ExpiringTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    # The API takes JSON only (uploads read their raw body): a form or multipart body
    # gets 415 naming the media type, never a QueryDict where a JSON object was meant.
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
    "TEST_REQUEST_DEFAULT_FORMAT": "json",
    "DEFAULT_SCHEMA_CLASS": "sessions_app.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "sessions_app.errors.exception_handler",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Backend.AI Web API",
    "DESCRIPTION": "Compute sessions, kernels, templates, data folders and agents.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    # Swagger UI from the drf-spectacular-sidecar package, served by the project.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # No badge fetched from validator.swagger.io.
    "SWAGGER_UI_SETTINGS": {"deepLinking": True, "validatorUrl": None},
    # JSON Schema 2020-12, as the launch spec is written (propertyNames, type lists).
    "OAS_VERSION": "3.1.0",
    # Three lists of statuses: a session's, a code run's answer and a recorded run's; and
    # two of folder permissions.
    "ENUM_NAME_OVERRIDES": {
        "StatusEnum": "sessions_app.models.Status",
        "ExecStatusEnum": "agent.protocol.EXEC_STATUSES",
        "RunStatusEnum": "sessions_app.models.RunStatus",
        # A share's permission, and the caller's access to a folder (a share's, or its owner's).
        "FolderPermissionEnum": "sessions_app.models.FolderPermission",
        "FolderAccessEnum": [("owner", "owner"), ("rw", "read-write"), ("ro", "read-only")],
    },
}

# --- domain settings -------------------------------------------------------
# Slot types a session may request. A missing slot counts as 0.
BAI_SLOT_TYPES = env_list("BAI_SLOT_TYPES", ["cpu", "mem", "cuda.device", "cuda.shares"])
# The admin's floor for every kernel, whatever its image: a kernel always gets
# real CPU and memory limits. Images may ask for more (Image.min_slots).
BAI_KERNEL_MIN_SLOTS = {
    "cpu": env_str("BAI_KERNEL_MIN_CPU", "0.01"),
    "mem": str(env_int("BAI_KERNEL_MIN_MEM", 16 * 2**20, minimum=6 * 2**20)),
}
# Users' data folders live below this root; nothing else is ever mounted.
BAI_STORAGE_ROOT = Path(env_str("BAI_STORAGE_ROOT", str(VAR_DIR / "storage"))).resolve()
BAI_AGENT_HEARTBEAT_INTERVAL = env_float("BAI_AGENT_HEARTBEAT_INTERVAL", 3.0, minimum=0.1)
BAI_AGENT_LOST_TIMEOUT = env_float("BAI_AGENT_LOST_TIMEOUT", 30.0, minimum=0.5)
BAI_LOG_TAIL_BYTES = env_int("BAI_LOG_TAIL_BYTES", 64 * 1024, minimum=1024)
BAI_TERMINAL_MAX_INPUT = env_int("BAI_TERMINAL_MAX_INPUT", 64 * 1024, minimum=16)
# Open terminals per user, across sessions and daphne processes; one more is
# refused with close code 4429.
BAI_MAX_TERMINALS_PER_USER = env_int("BAI_MAX_TERMINALS_PER_USER", 16, minimum=1)
# Seconds a "pass queued" flag holds back further requests for a pass: how long
# scheduling may stall when a worker dies with a pass queued (beat's backstop
# and a starting worker clear it sooner).
# The apps proxy (proxy_app, its own uvicorn process on its own port: proxy_app/serve.py): each app is served on an
# origin of its own, <session>-<app>.<host of BAI_APPS_ORIGIN>, never the manager's.
# Agents dial BAI_APPS_TUNNEL_URL for every proxied connection.
BAI_APPS_PORT = env_int("BAI_APPS_PORT", 8001, minimum=1)
BAI_APPS_ORIGIN = env_str("BAI_APPS_ORIGIN", f"http://apps.localhost:{BAI_APPS_PORT}")
# The Serving page's "try it" box calls an endpoint's router URL on the apps origin with a
# bearer token (never a cookie: it sends credentials "omit"), so pages may connect there.
CONTENT_SECURITY_POLICY["DIRECTIVES"]["connect-src"] = [SELF, BAI_APPS_ORIGIN]
BAI_APPS_TUNNEL_URL = env_str("BAI_APPS_TUNNEL_URL", f"ws://127.0.0.1:{BAI_APPS_PORT}")
BAI_APP_LINK_TTL = env_int("BAI_APP_LINK_TTL", 60, minimum=5)
BAI_APP_COOKIE_TTL = env_int("BAI_APP_COOKIE_TTL", 12 * 3600, minimum=60)
# The manager's own origin(s), as the browser names them (scheme://host:port, comma-separated):
# the only origins the inference router answers cross-origin requests from (the Serving page's
# "try it" box; never with credentials). Default: where scripts/run serves (BAI_PORT) on loopback.
_manager_port = env_int("BAI_PORT", 8000, minimum=1, maximum=65535)
BAI_MANAGER_ORIGIN = env_list(
    "BAI_MANAGER_ORIGIN",
    [f"http://{name}:{_manager_port}" for name in ("127.0.0.1", "localhost", *_bind_names)],
)
for _origin in BAI_MANAGER_ORIGIN:
    if not re.fullmatch(r"https?://[^/\s?#@]+", _origin):
        raise ImproperlyConfigured(
            f"BAI_MANAGER_ORIGIN: {_origin!r} is not an origin (scheme://host[:port], no path)"
        )
# The inference router (/serve/<endpoint>/ on the apps origin): how long a request to an
# endpoint scaled to zero is held while its first replica starts.
BAI_SERVE_COLD_START_TIMEOUT = env_float(
    "BAI_SERVE_COLD_START_TIMEOUT", 30.0, minimum=0.0, maximum=600.0
)
BAI_PASS_QUEUED_TTL = env_int("BAI_PASS_QUEUED_TTL", 3, minimum=1)
# Code execution (sessions_app.execution): seconds an agent gathers a run's output
# before it answers (a request waits for its answer that long plus 10 s), the
# output one run may produce (sent to agents at registration), the code one
# request may carry; each within what the protocol carries.
BAI_EXEC_FLUSH = env_float(
    "BAI_EXEC_FLUSH",
    protocol.EXEC_FLUSH_DEFAULT,
    minimum=protocol.EXEC_FLUSH_MIN,
    maximum=protocol.EXEC_FLUSH_MAX,
)
BAI_EXEC_OUTPUT_LIMIT = env_int(
    "BAI_EXEC_OUTPUT_LIMIT",
    protocol.EXEC_OUTPUT_LIMIT_DEFAULT,
    minimum=protocol.EXEC_OUTPUT_LIMIT_MIN,
    maximum=protocol.EXEC_OUTPUT_LIMIT_MAX,
)
BAI_EXEC_MAX_CODE = env_int(
    "BAI_EXEC_MAX_CODE", protocol.EXEC_CODE_MAX, minimum=1, maximum=protocol.EXEC_CODE_MAX
)

# /metrics (Prometheus) answers admins and the bearer of this token; open to
# anyone only when BAI_METRICS_PUBLIC says so (a scraper on a private network).
BAI_METRICS_PUBLIC = env_bool("BAI_METRICS_PUBLIC", False)
BAI_METRICS_TOKEN = env_str("BAI_METRICS_TOKEN", "")
if BAI_METRICS_TOKEN and len(BAI_METRICS_TOKEN) < 16:
    raise ImproperlyConfigured("BAI_METRICS_TOKEN must be at least 16 characters")

if PRODUCTION:
    # "__Host-": the browser takes these cookies only from this very host, over HTTPS,
    # host-only (Path=/, no Domain), so no other host (an app on the apps origin, whose
    # parent domain may be this one) can set or shadow them. The pages' scripts read the
    # CSRF token from the page (base.html), not from the cookie.
    SESSION_COOKIE_NAME = "__Host-sessionid"
    CSRF_COOKIE_NAME = "__Host-csrftoken"
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", True)
    SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 31536000, minimum=0)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", True)
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    STORAGES["staticfiles"]["BACKEND"] = "whitenoise.storage.CompressedManifestStaticFilesStorage"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    "loggers": {"django.db.backends": {"level": "WARNING"}},
}
