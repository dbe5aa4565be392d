"""One settings module; every value comes from the environment (see env.py).

The defaults give a working checkout: SQLite in ./var, a Redis on loopback
(the run command starts an embedded one), DEBUG on. Production sets
BAI_PRODUCTION=true, which turns DEBUG off, requires SECRET_KEY and the
database/redis URLs, and enables the secure-cookie/HSTS settings that
`manage.py check --deploy` asks for.
"""

from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from .env import env_bool, env_float, env_int, env_list, env_str

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("BAI_VAR_DIR", str(BASE_DIR / "var")))

PRODUCTION = env_bool("BAI_PRODUCTION", False)
DEBUG = env_bool("DEBUG", not PRODUCTION)

SECRET_KEY = env_str("SECRET_KEY", "")
if not SECRET_KEY:
    if PRODUCTION:
        raise ImproperlyConfigured("SECRET_KEY must be set when BAI_PRODUCTION=true")
    SECRET_KEY = "dev-only-insecure-key-do-not-use-in-production-0123456789abcdef"

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", [] if PRODUCTION else ["*"])
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
    "rest_framework.authtoken",
    "drf_spectacular",
    "channels",
    "sessions_app",
    "scheduler_app",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "sessions_app.middleware.BodySizeLimitMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
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
# Connections are kept (and health-checked) between requests, tasks and
# websocket handlers: opening one costs milliseconds on every status change.
DATABASES = {
    "default": dj_database_url.parse(
        DATABASE_URL,
        conn_max_age=env_int("BAI_DB_CONN_MAX_AGE", 60, minimum=0),
        conn_health_checks=True,
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    VAR_DIR.mkdir(parents=True, exist_ok=True)
    # Several processes (daphne, celery worker and beat) share the embedded
    # database file: wait for the write lock instead of failing at once.
    DATABASES["default"].setdefault("OPTIONS", {})
    DATABASES["default"]["OPTIONS"].update(
        {"timeout": 20, "transaction_mode": "IMMEDIATE", "init_command": "PRAGMA journal_mode=WAL;"}
    )

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
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
]
WHITENOISE_USE_FINDERS = True  # serve static/ without collectstatic in a checkout
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

REDIS_URL = env_str("REDIS_URL", "redis://127.0.0.1:6379/0")
CHANNEL_LAYERS = {
    "default": {
        # The pub/sub layer: one hop p50 ~0.24 ms against ~1.5 ms for the
        # list-based layer, and the terminal path crosses the layer twice.
        # Ours keeps a send() to a channel of the same process local (no Redis).
        "BACKEND": "backendai_web.channel_layer.LocalFirstPubSubChannelLayer",
        "CONFIG": {"hosts": [REDIS_URL], "prefix": env_str("BAI_CHANNEL_PREFIX", "bai")},
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
}

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "sessions_app.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "sessions_app.errors.exception_handler",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Backend.AI Web API",
    "DESCRIPTION": "Compute sessions, kernels, templates, data folders and agents.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    # JSON Schema 2020-12, as the launch spec is written (propertyNames, type lists).
    "OAS_VERSION": "3.1.0",
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

if PRODUCTION:
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
