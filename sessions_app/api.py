"""The REST API: one view per operation, thin: validate, authorise through
the selectors, call one service, serialise."""

from __future__ import annotations

import asyncio
import datetime
import inspect
import math
import re
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any
from urllib.parse import quote

from django.contrib.auth import authenticate
from django.db.models import Prefetch
from django.http import HttpResponse, QueryDict, StreamingHttpResponse
from django.utils import timezone
from drf_spectacular.contrib.knox_auth_token import KnoxTokenScheme
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_field,
    inline_serializer,
)
from rest_framework import serializers, status
from rest_framework.permissions import AllowAny, IsAdminUser
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from agent import protocol
from bai_common import units

from . import deadlines, execution, folder_files, selectors, services, tokens
from . import slots as slotlib
from .auth import LoginFailureThrottle
from .errors import (
    ApplicationError,
    Forbidden,
    InvalidInput,
    NotFound,
    PayloadTooLarge,
    TooManyRequests,
    field_error,
)
from .launch import FOLDER_NAME, image_catalogue, template_warnings
from .loop import db
from .models import (
    ACTIVE,
    DataFolder,
    ExecutionRun,
    FolderPermission,
    FolderShare,
    Kernel,
    ResourcePreset,
    Session,
    SessionTemplate,
    Status,
)
from .openapi import errors
from .preview import VERDICTS, launch_preview
from .specs import EXECUTE_SCHEMA, LAUNCH_SCHEMA, SPEC_SCHEMA, TEMPLATE_NAME, openapi_schema
from .templates import (
    DOCUMENT_SCHEMA,
    FORMATS,
    export_template_document,
    parse_template_document,
)

MAX_LIST = 500


class QueryFlag(serializers.BooleanField):
    """A yes/no query parameter: ``true``/``false`` (or ``1``/``0``), nothing looser."""

    TRUE_VALUES = {"true", "1"}
    FALSE_VALUES = {"false", "0"}
    NULL_VALUES: set[str] = set()


def _query(request: Request, serializer: type[serializers.Serializer]) -> dict[str, Any]:
    """A view's query parameters, validated like a body: a parameter given twice
    is refused (which value would count?). A NUL anywhere in a query never gets
    here (``middleware.NulQueryMiddleware``)."""
    params = request.query_params
    fields = serializer().fields
    repeated = [name for name in fields if len(params.getlist(name)) > 1]
    if repeated:
        raise InvalidInput(
            f"{repeated[0]}: given more than once",
            {name: ["given more than once"] for name in repeated},
        )
    data = serializer(data={name: params[name] for name in fields if name in params})
    data.is_valid(raise_exception=True)
    return dict(data.validated_data)


class StrictInputSerializer(serializers.Serializer):
    """Fields not listed here are refused, each named in the error."""

    # A misspelt field is never silently dropped; the OpenAPI document says so
    # (``additionalProperties: false``, openapi.AutoSchema).
    refuses_unknown_fields = True

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, Mapping):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise InvalidInput(
                    f"unknown field: {', '.join(map(str, unknown))}",
                    {str(name): ["unknown field"] for name in unknown},
                )
            if not isinstance(data, QueryDict):  # a form's values are all text
                _refuse_loose_types(self, data)
        return super().to_internal_value(data)


# DRF turns 0 into "0" and False, and 1 into True: in JSON a string is a
# string and a boolean a boolean, as the OpenAPI document says.
_JSON_TYPES = (
    (serializers.BooleanField, bool, "must be true or false"),
    (serializers.CharField, str, "must be a string"),
)


def _refuse_loose_types(serializer: serializers.Serializer, data: Mapping[str, Any]) -> None:
    wrong: dict[str, list[str]] = {}
    for name, field in serializer.fields.items():
        value = data.get(name)
        if name not in data or (value is None and field.allow_null):
            continue
        for kind, python_type, message in _JSON_TYPES:
            if isinstance(field, kind) and not isinstance(value, python_type):
                wrong[name] = [message]
    if wrong:
        raise serializers.ValidationError(wrong)


class AsyncApiView(APIView):
    """An APIView whose handlers are coroutines, so that waiting (for an agent)
    holds no thread and no database connection.

    DRF's checks (authentication, permissions, throttles) may query the database:
    they run in the shared thread pool, which gives the connection back after.
    The rest (the handler, errors, rendering) runs on the event loop, where the
    ORM is not used; handlers reach it through ``loop.db``. (A handler that
    only waits between two pieces of ORM work can be a sync view that gives its
    connection back before it waits: ``execution.execute``.)
    """

    async def dispatch(self, request: Any, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        self.args, self.kwargs = args, kwargs
        request = self.initialize_request(request, *args, **kwargs)
        self.request = request
        self.headers = self.default_response_headers
        try:
            await db(self.initial)(request, *args, **kwargs)
            method = request.method.lower()
            handler = getattr(self, method, None) if method in self.http_method_names else None
            response = (handler or self.http_method_not_allowed)(request, *args, **kwargs)
            if inspect.isawaitable(response):
                response = await response
        except Exception as exc:
            response = self.handle_exception(exc)
        self.response = self.finalize_response(request, response, *args, **kwargs)
        return self.response


# --- auth -------------------------------------------------------------------


class ExpiringTokenScheme(KnoxTokenScheme):
    """The schema's name for ``Authorization: Token <token>`` (ours extends knox's check)."""

    target_class = "sessions_app.tokens.ExpiringTokenAuthentication"
    name = "tokenAuth"


class TokenCreateApi(APIView):
    """Exchange a username and password for a new API token that expires.

    Failed attempts are counted per user name and client address; past the
    limit the answer is 429 with ``extra.retry_after`` (and ``Retry-After``).
    """

    permission_classes = [AllowAny]
    authentication_classes: list[Any] = []
    throttle_classes = [LoginFailureThrottle]

    class InputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "TokenCreateInput"

        username = serializers.CharField()
        password = serializers.CharField(style={"input_type": "password"})

    @extend_schema(
        request=InputSerializer,
        responses=inline_serializer(
            "Token",
            {"token": serializers.CharField(), "expires_at": serializers.DateTimeField()},
        ),
    )
    def post(self, request: Request) -> Response:
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        user = authenticate(
            request,
            username=data.validated_data["username"],
            password=data.validated_data["password"],
        )
        if user is None or not user.is_active:
            LoginFailureThrottle.record_failure(request)
            raise ApplicationError("Wrong username or password.")
        LoginFailureThrottle.record_success(request)
        token, key = tokens.token_create(user=user)
        return Response({"token": key, "expires_at": token.expiry})

    def throttled(self, request: Request, wait: float | None) -> None:
        seconds = math.ceil(wait or 1)
        raise TooManyRequests(f"Too many failed logins: try again in {seconds} s.", seconds)


# --- sessions ---------------------------------------------------------------


class KernelOutputSerializer(serializers.ModelSerializer):
    agent = serializers.CharField(source="agent_id", allow_null=True)

    class Meta:
        model = Kernel
        fields = [
            "id",
            "cluster_role",
            "cluster_idx",
            "local_rank",
            "cluster_hostname",
            "image",
            "requested_slots",
            "agent",
            "container_id",
            "status",
            "status_reason",
            "exit_code",
            "created_at",
            "started_at",
            "terminated_at",
        ]


class LimitsSerializer(serializers.Serializer):
    """The time limits that apply to a session, in seconds (null: none applies).

    Known from launch on, so a page can say what will apply while the session
    waits and its deadlines are still null: ``idle_timeout`` (interactive
    sessions, from the owner's policy), ``max_session_lifetime`` (the owner's
    policy) and ``batch_timeout`` (batch sessions, their own).
    """

    idle_timeout = serializers.IntegerField(allow_null=True)
    max_session_lifetime = serializers.IntegerField(allow_null=True)
    batch_timeout = serializers.IntegerField(allow_null=True)


def _seconds(value: Any) -> int | None:
    return int(value.total_seconds()) if value is not None else None


class SessionAppSerializer(serializers.Serializer):
    name = serializers.CharField()
    title = serializers.CharField()
    protocol = serializers.ChoiceField(choices=["http", "tcp"])
    port = serializers.IntegerField()
    on_demand = serializers.BooleanField(help_text="Started by the session when first opened.")
    forward_url = serializers.CharField(
        help_text="The apps proxy's raw-TCP websocket (`Authorization: Token`) that `bai app` "
        "forwards a local port through."
    )
    forward_token = serializers.CharField(
        allow_null=True,
        help_text="The token an app the session starts (Jupyter) asks for when reached through "
        "a forwarded port: open `http://HOST:PORT/?token=<it>` (`bai app` prints that link). "
        "On the apps origin the proxy presents it itself. Null for the user's own ports.",
    )


class SessionOutputSerializer(serializers.ModelSerializer):
    owner = serializers.CharField(source="owner.username")
    image = serializers.CharField(source="image.reference")
    resource_group = serializers.CharField(source="resource_group.name")
    type = serializers.CharField(source="session_type")
    # main1's resources; ``total_resources`` is the sum over the real kernels.
    resources = serializers.JSONField(source="requested_slots")
    total_resources = serializers.SerializerMethodField()
    env = serializers.JSONField(source="environ")
    mounts = serializers.SerializerMethodField()
    depends_on = serializers.SerializerMethodField()
    kernels = KernelOutputSerializer(many=True)
    idle_deadline = serializers.SerializerMethodField()
    lifetime_deadline = serializers.SerializerMethodField()
    batch_deadline = serializers.SerializerMethodField()
    seconds_left = serializers.SerializerMethodField()
    limits = serializers.SerializerMethodField()
    ports = serializers.JSONField(source="preopen_ports")
    apps = serializers.SerializerMethodField()

    class Meta:
        model = Session
        fields = [
            "id",
            "name",
            "owner",
            "type",
            "status",
            "status_reason",
            "status_changed_at",
            "cluster_mode",
            "cluster_size",
            "resources",
            "total_resources",
            "image",
            "resource_group",
            "template",
            "env",
            "mounts",
            "startup_command",
            "depends_on",
            "starts_at",
            "result",
            "exit_code",
            "scheduling_attempts",
            "created_at",
            "scheduled_at",
            "started_at",
            "terminated_at",
            "last_activity_at",
            "idle_deadline",
            "lifetime_deadline",
            "batch_deadline",
            "seconds_left",
            "limits",
            "ports",
            "apps",
            "kernels",
        ]

    @extend_schema_field(SessionAppSerializer(many=True))
    def get_apps(self, obj: Session) -> list[dict[str, Any]]:
        """main1's apps (the image's, then the user's ports), for the launcher; each
        with the websocket that ``bai app`` forwards a local port through, and the
        token an app the session starts (Jupyter) asks for there."""
        return [
            {
                **app.to_dict(),
                "forward_url": services.app_forward_url(session_id=obj.pk, app=app.name),
                "forward_token": (
                    services.app_secret(session_id=obj.pk, app=app.name)
                    if app.start_command
                    else None
                ),
            }
            for app in selectors.session_apps(session=obj)
        ]

    def get_total_resources(self, obj: Session) -> dict[str, str]:
        return obj.total_slots()

    def get_mounts(self, obj: Session) -> list[str]:
        return [f.name for f in obj.mounts.all()]

    def get_depends_on(self, obj: Session) -> list[str]:
        # .all(), not values_list(): the list view prefetches depends_on.
        return [str(dep.pk) for dep in obj.depends_on.all()]

    def _policy(self, obj: Session) -> Any:
        # One policy query per owner per response (context is shared by a list).
        policies = self.context.setdefault("owner_policies", {})
        if obj.owner_id not in policies:
            policies[obj.owner_id] = deadlines.owner_policy(owner_id=obj.owner_id)
        return policies[obj.owner_id]

    def _deadlines(self, obj: Session) -> deadlines.Deadlines:
        if not hasattr(obj, "_deadlines"):
            main = next((k for k in obj.kernels.all() if k.cluster_role == "main"), None)
            obj._deadlines = deadlines.session_deadlines(
                session=obj,
                policy=self._policy(obj),
                main_started_at=main.started_at if main else None,
            )
        return obj._deadlines

    def _iso(self, value: Any) -> str | None:
        return serializers.DateTimeField().to_representation(value) if value else None

    def get_idle_deadline(self, obj: Session) -> str | None:
        return self._iso(self._deadlines(obj).idle)

    def get_lifetime_deadline(self, obj: Session) -> str | None:
        return self._iso(self._deadlines(obj).lifetime)

    def get_batch_deadline(self, obj: Session) -> str | None:
        return self._iso(self._deadlines(obj).batch)

    def get_seconds_left(self, obj: Session) -> int | None:
        return self._deadlines(obj).seconds_left(timezone.now())

    @extend_schema_field(LimitsSerializer)
    def get_limits(self, obj: Session) -> dict[str, int | None]:
        policy = self._policy(obj)
        interactive = obj.session_type == "interactive"
        return {
            "idle_timeout": _seconds(policy.idle_timeout) if policy and interactive else None,
            "max_session_lifetime": _seconds(policy.max_session_lifetime) if policy else None,
            "batch_timeout": _seconds(obj.batch_timeout) if obj.session_type == "batch" else None,
        }


class EventOutputSerializer(serializers.Serializer):
    time = serializers.DateTimeField(source="created_at")
    kernel = serializers.SerializerMethodField()
    from_status = serializers.CharField()
    to_status = serializers.CharField()
    reason = serializers.CharField()

    def get_kernel(self, obj: Any) -> str | None:
        return obj.kernel.cluster_hostname if obj.kernel_id else None


class DependencySerializer(serializers.Serializer):
    id = serializers.UUIDField()
    name = serializers.CharField()
    status = serializers.CharField()
    result = serializers.CharField()


class SessionDetailSerializer(SessionOutputSerializer):
    events = serializers.SerializerMethodField()
    dependencies = serializers.SerializerMethodField()

    class Meta(SessionOutputSerializer.Meta):
        fields = SessionOutputSerializer.Meta.fields + ["dependencies", "events"]

    @extend_schema_field(DependencySerializer(many=True))
    def get_dependencies(self, obj: Session) -> list[dict[str, Any]]:
        """The sessions it waits for, by name (``depends_on`` has their ids), oldest first."""
        deps = sorted(obj.depends_on.all(), key=lambda dep: dep.created_at)
        return DependencySerializer(deps, many=True).data

    def get_events(self, obj: Session) -> list[dict[str, Any]]:
        return EventOutputSerializer(selectors.session_events(session=obj), many=True).data


class SessionListCreateApi(APIView):
    class QuerySerializer(serializers.Serializer):
        class Meta:
            ref_name = "SessionListQuery"

        all = QueryFlag(required=False, default=False, help_text="Admins: every user's sessions.")
        status = serializers.ChoiceField(
            choices=Status.values, required=False, help_text="Only sessions in this status."
        )

    @extend_schema(parameters=[QuerySerializer], responses=SessionOutputSerializer(many=True))
    def get(self, request: Request) -> Response:
        query = _query(request, self.QuerySerializer)
        qs = selectors.sessions_for_user(user=request.user, include_all=query["all"])
        if "status" in query:
            qs = qs.filter(status=query["status"])
        qs = qs.prefetch_related("mounts", "depends_on")
        return Response(SessionOutputSerializer(qs[:MAX_LIST], many=True).data)

    @extend_schema(
        request={"application/json": openapi_schema(LAUNCH_SCHEMA)},
        responses={201: SessionDetailSerializer, **errors(403, 409)},
    )
    def post(self, request: Request) -> Response:
        # The shape is checked once, by the launch schema (launch.plan_launch).
        session = services.session_create(owner=request.user, spec=request.data)
        session = selectors.get_session_detail_for_user(user=request.user, session_id=session.pk)
        return Response(SessionDetailSerializer(session).data, status=status.HTTP_201_CREATED)


# --- will it fit ------------------------------------------------------------------------------


class SlotAmountsField(serializers.DictField):
    """Slot -> exact decimal string (``mem`` in bytes)."""

    child = serializers.CharField()


class PreviewContainersSerializer(serializers.Serializer):
    role = serializers.ChoiceField(choices=["main", "sub"])
    count = serializers.IntegerField(help_text="Containers of this role (main: 1).")
    resources = SlotAmountsField(help_text="Per container.")


class PreviewResourcesSerializer(serializers.Serializer):
    cluster_mode = serializers.CharField()
    cluster_size = serializers.IntegerField()
    containers = PreviewContainersSerializer(many=True)
    total = SlotAmountsField(help_text="All containers together.")
    text = serializers.CharField(help_text='The total for people, e.g. "3 cpu, 3 GiB mem".')


class PreviewSlotQuotaSerializer(serializers.Serializer):
    limit = serializers.CharField(allow_null=True, help_text="null: unlimited.")
    used = serializers.CharField(help_text="Held now by the user's running sessions.")
    left = serializers.CharField(allow_null=True, help_text="null: unlimited.")
    text = serializers.CharField()


class PreviewSessionQuotaSerializer(serializers.Serializer):
    limit = serializers.IntegerField(allow_null=True)
    active = serializers.IntegerField()
    left = serializers.IntegerField(allow_null=True)


class PreviewPendingQuotaSerializer(serializers.Serializer):
    limit = serializers.IntegerField(allow_null=True)
    pending = serializers.IntegerField()
    left = serializers.IntegerField(allow_null=True)


class PreviewQuotaSerializer(serializers.Serializer):
    policy = serializers.CharField(allow_null=True, help_text="The resource policy that applies.")
    slots = serializers.DictField(child=PreviewSlotQuotaSerializer())
    sessions = PreviewSessionQuotaSerializer(
        help_text="Concurrent sessions (for a system session: concurrent system sessions)."
    )
    pending_sessions = PreviewPendingQuotaSerializer()
    max_containers_per_session = serializers.IntegerField(allow_null=True)


class PreviewGroupSlotSerializer(serializers.Serializer):
    capacity = serializers.CharField()
    occupied = serializers.CharField()
    free = serializers.CharField()
    largest_free = serializers.CharField(help_text="The most free on any one agent.")
    text = serializers.CharField()


class PreviewGroupSerializer(serializers.Serializer):
    name = serializers.CharField()
    session_selection = serializers.CharField()
    agents = serializers.IntegerField(help_text="Agents alive and schedulable now.")
    pending_sessions = serializers.IntegerField(help_text="Sessions waiting in this group.")
    slots = serializers.DictField(child=PreviewGroupSlotSerializer())


class PreviewOutputSerializer(serializers.Serializer):
    verdict = serializers.ChoiceField(
        choices=list(VERDICTS),
        help_text="start_now: the next scheduling pass should place it; wait: it would be "
        "accepted and wait (reason says for what); never: it can never fit (a launch is refused "
        "with the same reason) or a dependency already failed.",
    )
    reason = serializers.CharField(help_text="The first reason, in the scheduler's words.")
    reasons = serializers.ListField(
        child=serializers.CharField(), help_text="Every reason it would wait."
    )
    resources = PreviewResourcesSerializer()
    quota = PreviewQuotaSerializer(help_text="What is left of the user's quota.")
    resource_group = PreviewGroupSerializer(help_text="What the chosen group has free now.")
    warnings = serializers.ListField(
        child=serializers.CharField(),
        help_text="What the session will not do that you may count on, e.g. `ssh sub1` when "
        "the sub kernels' image has no SSH server. A launch is not refused for them.",
    )


class SessionPreviewApi(APIView):
    """Will it fit: the launch spec of ``POST /sessions/``, judged without launching."""

    @extend_schema(
        request={"application/json": openapi_schema(LAUNCH_SCHEMA)},
        responses={200: PreviewOutputSerializer},
        description="Takes the launch spec of POST /api/v1/sessions/ and writes nothing. "
        "A bad spec (400) and the pending-session limit (403) answer as a launch would; "
        "a session that can never fit answers 200 with verdict never and the launch's reason.",
    )
    def post(self, request: Request) -> Response:
        preview = launch_preview(owner=request.user, spec=request.data)
        return Response(PreviewOutputSerializer(preview).data)


class SessionDetailApi(APIView):
    @extend_schema(responses=SessionDetailSerializer)
    def get(self, request: Request, session_id: str) -> Response:
        session = selectors.get_session_detail_for_user(user=request.user, session_id=session_id)
        return Response(SessionDetailSerializer(session).data)


class SessionAppOpenApi(APIView):
    class OutputSerializer(serializers.Serializer):
        url = serializers.CharField()
        origin = serializers.CharField()
        app = serializers.JSONField()

    @extend_schema(
        request=None,
        responses=OutputSerializer,
        description="A one-time link (valid BAI_APP_LINK_TTL seconds) that opens an app of "
        "main1 on the apps origin; the app starts on the first request if it is not running.",
    )
    def post(self, request: Request, session_id: str, app: str) -> Response:
        session = selectors.get_session_for_user(user=request.user, session_id=session_id)
        opened = services.app_open(user=request.user, session=session, name=app)
        return Response(self.OutputSerializer(opened).data)


class ExecRecordSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(choices=list(protocol.EXEC_RECORD_KINDS))
    data = serializers.CharField(
        help_text="stdout/stderr: text; result/display: the bundle in `mime` (image/png is "
        "base64); error: the traceback (ANSI escapes kept); notice: e.g. the output cut marker."
    )
    mime = serializers.CharField(allow_null=True)


class ExecOutputSerializer(serializers.Serializer):
    status = serializers.ChoiceField(
        choices=list(protocol.EXEC_STATUSES),
        help_text="finished; continued (more to come: ask again with mode continue); "
        "waiting-input (send the line with mode input); exec-timeout (past options.timeout).",
    )
    run_id = serializers.CharField(help_text="The run's id (empty for complete).")
    exit_code = serializers.IntegerField(
        allow_null=True,
        help_text="Once finished: 0, or 1 after an exception (batch: the command's).",
    )
    records = ExecRecordSerializer(many=True, help_text="What the run wrote since the last answer.")
    error = serializers.CharField(
        required=False,
        help_text="Once a run ended on an exception: its name (KeyboardInterrupt when "
        "interrupted, a batch's too). Absent otherwise.",
    )
    completions = serializers.ListField(
        child=serializers.CharField(), required=False, help_text="For mode complete."
    )


class SessionExecuteApi(APIView):
    # A sync view: DRF's checks, the body's and the session's, and the run's record in the
    # request's thread, one after the other; the wait on the event loop, with no connection
    # held (execution.execute).

    def get_authenticators(self) -> list[Any]:
        """The token's check reads the URL's session's main1 beside the token, in one
        query (``execution.MainFactsReader``), for ``post``."""
        self.main_facts = execution.MainFactsReader(self.kwargs.get("session_id"))
        return [
            tokens.ExpiringTokenAuthentication(self.main_facts)
            if type(auth) is tokens.ExpiringTokenAuthentication
            else auth
            for auth in super().get_authenticators()
        ]

    @extend_schema(
        request={"application/json": openapi_schema(EXECUTE_SCHEMA)},
        responses={200: ExecOutputSerializer, **errors(409, 504)},
        description="Runs code in main1 (one run at a time per session; state persists between "
        "runs). query and batch start a run and answer within BAI_EXEC_FLUSH seconds with what it "
        "wrote so far; continue asks for more of run_id, input gives a run waiting for input its "
        "line (in code), interrupt stops it, complete lists completions at options.cursor_pos. "
        "409: a batch session, a session not running, or the agent's refusal (e.g. another run "
        "is still going). 504: the agent did not answer in time.",
    )
    def post(self, request: Request, session_id: str) -> Response:
        return Response(
            execution.execute(
                user=request.user,
                session_id=session_id,
                body=request.data,
                read=self.main_facts.read,
            )
        )


class RunSerializer(serializers.ModelSerializer):
    user = serializers.CharField(source="user.username")
    outcome = serializers.CharField(
        read_only=True,
        help_text='How it ended: "finished", "error: ZeroDivisionError", "interrupted", '
        '"exit status 3", "timed out", or "running".',
    )

    class Meta:
        model = ExecutionRun
        fields = [
            "run_id",
            "mode",
            "user",
            "status",
            "exit_code",
            "error",
            "outcome",
            "started_at",
            "finished_at",
        ]


class SessionRunsApi(APIView):
    @extend_schema(responses=RunSerializer(many=True))
    def get(self, request: Request, session_id: str) -> Response:
        """The session's code runs, newest first (the latest 500)."""
        session = selectors.get_session_for_user(user=request.user, session_id=session_id)
        runs = selectors.session_runs(session=session)[:MAX_LIST]
        return Response(RunSerializer(runs, many=True).data)


class SessionTerminateApi(APIView):
    class InputSerializer(StrictInputSerializer):
        class Meta:
            ref_name = "SessionTerminateInput"

        reason = serializers.CharField(required=False, max_length=200)

    @extend_schema(request=InputSerializer, responses={200: SessionDetailSerializer, **errors(409)})
    def post(self, request: Request, session_id: str) -> Response:
        session = selectors.get_session_for_user(user=request.user, session_id=session_id)
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        who = (
            "its owner" if session.owner_id == request.user.pk else f"admin {request.user.username}"
        )
        reason = data.validated_data.get("reason") or f"terminated by {who}"
        services.session_terminate(session=session, reason=reason)
        session = selectors.get_session_detail_for_user(user=request.user, session_id=session_id)
        return Response(SessionDetailSerializer(session).data)


class KernelLogsApi(APIView):
    @extend_schema(
        responses=inline_serializer(
            "KernelLogs",
            {
                "kernel": serializers.CharField(),
                "status": serializers.CharField(),
                "live": serializers.BooleanField(),
                "log": serializers.CharField(),
            },
        )
    )
    def get(self, request: Request, session_id: str, kernel_id: str) -> Response:
        kernel = selectors.get_kernel_for_user(
            user=request.user, session_id=session_id, kernel_ref=kernel_id
        )
        return Response(
            {
                "kernel": kernel.cluster_hostname,
                "status": kernel.status,
                "live": not kernel.is_terminal,
                "log": kernel.log_tail,
            }
        )


# --- templates --------------------------------------------------------------


class TemplateSerializer(serializers.ModelSerializer):
    owner = serializers.CharField(source="owner.username", allow_null=True, default=None)
    warnings = serializers.SerializerMethodField()

    class Meta:
        model = SessionTemplate
        fields = [
            "id",
            "name",
            "description",
            "owner",
            "is_shared",
            "spec",
            "warnings",
            "created_at",
            "updated_at",
        ]

    @extend_schema_field(
        serializers.ListField(
            child=serializers.CharField(),
            help_text="What a session from it will not do that you may count on, e.g. `ssh "
            "sub1` when its sub kernels' image has no SSH server (saved all the same).",
        )
    )
    def get_warnings(self, obj: SessionTemplate) -> list[str]:
        return template_warnings(obj.spec, self.context.get("images"))


@extend_schema_field(openapi_schema(SPEC_SCHEMA))
class SpecField(serializers.JSONField):
    """A launch spec, validated by the service against ``specs.SPEC_SCHEMA``."""


class TemplateInputSerializer(StrictInputSerializer):
    # The service judges name and description (``templates.validate_template_fields``);
    # the pattern documents the name's rule.
    name = serializers.RegexField(
        TEMPLATE_NAME["pattern"],
        max_length=64,
        trim_whitespace=False,
        error_messages={"invalid": TEMPLATE_NAME["x-errors"]["pattern"]},
    )
    description = serializers.CharField(
        max_length=255, required=False, allow_blank=True, default="", trim_whitespace=False
    )
    spec = SpecField()
    is_shared = serializers.BooleanField(required=False, default=False)


def _owned_template(request: Request, template_id: int) -> SessionTemplate:
    """Templates one may change: own ones; admins also shared ones."""
    template = SessionTemplate.objects.filter(pk=template_id).first()
    if template is None:
        raise NotFound("No such template.")
    if selectors.template_can_change(user=request.user, template=template):
        return template
    if template.is_shared or template.owner_id is None:
        raise Forbidden("This shared template belongs to the admins; you may only use it.")
    raise NotFound("No such template.")


def _visible_template(request: Request, template_id: int) -> SessionTemplate:
    """Templates one may read: own and shared ones; admins any (they may change any)."""
    return selectors.get_template_for_user(user=request.user, template_id=template_id)


class TemplateListCreateApi(APIView):
    class QuerySerializer(serializers.Serializer):
        class Meta:
            ref_name = "TemplateListQuery"

        all = QueryFlag(required=False, default=False, help_text="Admins: every user's templates.")

    @extend_schema(parameters=[QuerySerializer], responses=TemplateSerializer(many=True))
    def get(self, request: Request) -> Response:
        query = _query(request, self.QuerySerializer)
        qs = selectors.templates_for_user(user=request.user, include_all=query["all"])
        qs = qs.select_related("owner")
        images = image_catalogue()  # one query for every template's warnings
        return Response(TemplateSerializer(qs, many=True, context={"images": images}).data)

    @extend_schema(
        request=TemplateInputSerializer, responses={201: TemplateSerializer, **errors(409)}
    )
    def post(self, request: Request) -> Response:
        data = TemplateInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        shared = data.validated_data["is_shared"] and request.user.is_staff
        template = services.template_save(
            owner=request.user,
            name=data.validated_data["name"],
            description=data.validated_data["description"],
            spec=data.validated_data["spec"],
            is_shared=shared,
        )
        return Response(TemplateSerializer(template).data, status=status.HTTP_201_CREATED)


class TemplateDetailApi(APIView):
    @extend_schema(responses=TemplateSerializer)
    def get(self, request: Request, template_id: int) -> Response:
        return Response(TemplateSerializer(_visible_template(request, template_id)).data)

    @extend_schema(
        request=TemplateInputSerializer, responses={200: TemplateSerializer, **errors(409)}
    )
    def put(self, request: Request, template_id: int) -> Response:
        template = _owned_template(request, template_id)
        data = TemplateInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        template = services.template_save(
            owner=template.owner,
            name=data.validated_data["name"],
            description=data.validated_data["description"],
            spec=data.validated_data["spec"],
            is_shared=data.validated_data["is_shared"] and request.user.is_staff,
            template=template,
        )
        return Response(TemplateSerializer(template).data)

    @extend_schema(responses={204: None})
    def delete(self, request: Request, template_id: int) -> Response:
        _owned_template(request, template_id).delete()
        return Response(status=status.HTTP_204_NO_CONTENT)


class TemplateExportApi(APIView):
    def perform_content_negotiation(self, request: Request, force: bool = False) -> Any:
        # ``?format=`` picks the document's format here, not a DRF renderer
        # (which would answer 404 to ``yaml``); errors are still JSON.
        renderer = JSONRenderer()
        return renderer, renderer.media_type

    class QuerySerializer(serializers.Serializer):
        class Meta:
            ref_name = "TemplateExportQuery"

        format = serializers.ChoiceField(choices=FORMATS, default="yaml")

    @extend_schema(
        parameters=[QuerySerializer],
        responses={
            (200, "application/yaml"): OpenApiResponse(
                openapi_schema(DOCUMENT_SCHEMA),
                description="The template as a YAML document (`?format=yaml`).",
            ),
            (200, "application/json"): OpenApiResponse(
                openapi_schema(DOCUMENT_SCHEMA),
                description="The template as a JSON document (`?format=json`).",
            ),
        },
    )
    def get(self, request: Request, template_id: int) -> HttpResponse:
        template = _visible_template(request, template_id)
        fmt = _query(request, self.QuerySerializer)["format"]
        text = export_template_document(
            name=template.name, description=template.description, spec=template.spec, fmt=fmt
        )
        # A plain response: the document is the body, not a JSON-quoted string.
        response = HttpResponse(
            text, content_type="application/json" if fmt == "json" else "application/yaml"
        )
        response["Content-Disposition"] = _attachment(f"{template.name}.{fmt}")
        return response


def _attachment(filename: str) -> str:
    """``Content-Disposition`` for a download, whatever the name holds (a name
    stored before control characters were refused must not break the header):
    an ASCII fallback, and the name itself as RFC 6266's ``filename*``."""
    printable = "".join(c if c.isprintable() else "_" for c in filename)
    fallback = re.sub(r"[^A-Za-z0-9._-]", "_", printable)
    return f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{quote(printable, safe='')}"


class TemplateImportApi(APIView):
    class InputSerializer(StrictInputSerializer):
        class Meta:
            ref_name = "TemplateImportInput"

        format = serializers.ChoiceField(choices=["yaml", "json"], default="yaml")
        document = serializers.CharField(max_length=64 * 1024, trim_whitespace=False)

    @extend_schema(request=InputSerializer, responses={201: TemplateSerializer, **errors(409)})
    def post(self, request: Request) -> Response:
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        document = parse_template_document(
            data.validated_data["document"], data.validated_data["format"]
        )
        template = services.template_save(
            owner=request.user,
            name=document["name"],
            description=document.get("description", ""),
            spec=document["spec"],
        )
        return Response(TemplateSerializer(template).data, status=status.HTTP_201_CREATED)


# --- folders ----------------------------------------------------------------


class FolderSessionSerializer(serializers.Serializer):
    id = serializers.CharField()
    name = serializers.CharField()


class FolderShareSerializer(serializers.Serializer):
    user = serializers.CharField(source="user.username")
    permission = serializers.ChoiceField(choices=FolderPermission.choices)


class FolderSerializer(serializers.Serializer):
    """A folder as one user sees it (``context["user"]``)."""

    id = serializers.IntegerField()
    name = serializers.CharField()
    owner = serializers.CharField(source="owner.username")
    permission = serializers.SerializerMethodField(
        help_text='"owner" (also an admin\'s), or the share\'s "rw" / "ro".'
    )
    size_bytes = serializers.SerializerMethodField(help_text="Regular files; links not followed.")
    file_count = serializers.SerializerMethodField()
    size_complete = serializers.SerializerMethodField(
        help_text="false: the walk stopped at its time bound; the figures are a lower bound."
    )
    created_at = serializers.DateTimeField()
    mounted_by = serializers.SerializerMethodField(
        help_text="Live sessions mounting it: every one for its owner and admins, "
        "else the caller's own."
    )
    shares = serializers.SerializerMethodField(help_text="For its owner and admins; else [].")
    measured_bytes = serializers.IntegerField(
        allow_null=True,
        help_text="The bytes last measured (after each upload, and every "
        "BAI_FOLDER_MEASURE_INTERVAL seconds while a session mounts it); null: not yet.",
    )
    measured_at = serializers.DateTimeField(allow_null=True)
    over_quota = serializers.SerializerMethodField(
        help_text="true: its owner's folders, as last measured, hold more than the owner's "
        "byte quota (sessions wrote past it); uploads into them are refused until under."
    )

    def _user(self) -> Any:
        return self.context["user"]

    def get_over_quota(self, obj: DataFolder) -> bool:
        over = self.context.setdefault("over_quota", {})
        if obj.owner_id not in over:
            over[obj.owner_id] = selectors.owner_over_quota(owner=obj.owner)
        return bool(over[obj.owner_id])

    def _manages(self, obj: DataFolder) -> bool:
        return obj.owner_id == self._user().pk or bool(self._user().is_staff)

    def _usage(self, obj: DataFolder) -> Any:
        if not hasattr(obj, "_usage"):
            obj._usage = selectors.folder_usage(folder=obj)
        return obj._usage

    @extend_schema_field(serializers.ChoiceField(choices=["owner", "rw", "ro"]))
    def get_permission(self, obj: DataFolder) -> str:
        if obj.owner_id == self._user().pk:
            return "owner"
        share = next((s for s in obj.shares.all() if s.user_id == self._user().pk), None)
        return share.permission if share is not None else "owner"

    def get_size_bytes(self, obj: DataFolder) -> int:
        return int(self._usage(obj).bytes)

    def get_file_count(self, obj: DataFolder) -> int:
        return int(self._usage(obj).files)

    def get_size_complete(self, obj: DataFolder) -> bool:
        return bool(self._usage(obj).complete)

    @extend_schema_field(FolderSessionSerializer(many=True))
    def get_mounted_by(self, obj: DataFolder) -> list[dict[str, str]]:
        live = getattr(obj, "live_sessions", None)
        if live is None:
            live = list(selectors.folder_sessions_mounting(folder=obj))
        if not self._manages(obj):
            live = [s for s in live if s.owner_id == self._user().pk]
        return [{"id": str(s.pk), "name": s.name} for s in live]

    @extend_schema_field(FolderShareSerializer(many=True))
    def get_shares(self, obj: DataFolder) -> list[dict[str, str]]:
        if not self._manages(obj):
            return []
        return [{"user": s.user.username, "permission": s.permission} for s in obj.shares.all()]


def _folders_with_details(qs: Any) -> Any:
    return qs.prefetch_related(
        Prefetch("shares", queryset=FolderShare.objects.select_related("user")),
        Prefetch(
            "sessions",
            queryset=Session.objects.filter(status__in=ACTIVE).order_by("created_at"),
            to_attr="live_sessions",
        ),
    )


def _folder_out(request: Request, folder: DataFolder) -> dict[str, Any]:
    folder = _folders_with_details(DataFolder.objects.select_related("owner")).get(pk=folder.pk)
    return FolderSerializer(folder, context={"user": request.user}).data


class FolderListCreateApi(APIView):
    class InputSerializer(StrictInputSerializer):
        class Meta:
            ref_name = "FolderCreateInput"

        # The service judges the whole name (``launch.FOLDER_NAME``); the pattern documents it.
        name = serializers.RegexField(
            f"^{FOLDER_NAME.pattern}$",
            max_length=64,
            trim_whitespace=False,
            error_messages={
                "invalid": "use up to 64 letters, digits, '_' or '-', starting with a letter or digit"
            },
        )

    @extend_schema(responses=FolderSerializer(many=True))
    def get(self, request: Request) -> Response:
        """Own folders and those shared with the caller, with size, file count,
        the live sessions mounting each and (for the owner) its shares."""
        folders = _folders_with_details(selectors.folders_for_user(user=request.user))
        return Response(FolderSerializer(folders, many=True, context={"user": request.user}).data)

    @extend_schema(request=InputSerializer, responses={201: FolderSerializer, **errors(409)})
    def post(self, request: Request) -> Response:
        """Refused past the policy's ``max_folders`` (403, with the figures)."""
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        folder = services.folder_create(owner=request.user, name=data.validated_data["name"])
        return Response(_folder_out(request, folder), status=status.HTTP_201_CREATED)


class FolderQuotaApi(APIView):
    @extend_schema(
        responses=inline_serializer(
            "FolderQuota",
            {
                "folder_count": serializers.IntegerField(),
                "max_folders": serializers.IntegerField(allow_null=True),
                "used_bytes": serializers.IntegerField(),
                "max_bytes": serializers.IntegerField(allow_null=True),
            },
        )
    )
    def get(self, request: Request) -> Response:
        """The caller's storage quota and use (nulls: unlimited)."""
        quota = selectors.folder_quota(user=request.user)
        return Response(
            {
                "folder_count": quota.folder_count,
                "max_folders": quota.max_folders,
                "used_bytes": quota.used_bytes,
                "max_bytes": quota.max_bytes,
            }
        )


class FolderDetailApi(APIView):
    @extend_schema(responses=FolderSerializer)
    def get(self, request: Request, folder_id: int) -> Response:
        access = selectors.get_folder_for_user(user=request.user, folder_id=folder_id)
        return Response(_folder_out(request, access.folder))

    @extend_schema(responses={204: None, **errors(409)})
    def delete(self, request: Request, folder_id: int) -> Response:
        """Refused (409, naming every one) while live sessions mount it. Owner or admin."""
        access = selectors.get_folder_for_user(user=request.user, folder_id=folder_id)
        access.require_manage()
        services.folder_delete(folder=access.folder)
        return Response(status=status.HTTP_204_NO_CONTENT)


# Files inside a folder. ``path`` is relative to the folder (``folder_files.clean_path``).

PATH_HELP = (
    "Relative to the folder, '/'-separated; no '..', '.', empty part or NUL; a name made "
    "(upload, mkdir, rename's new_path) has no backslash, control character or leading drive "
    "('C:'); "
    f"at most {folder_files.MAX_PATH_BYTES} bytes and {folder_files.MAX_DEPTH} levels."
)


class PathQuerySerializer(serializers.Serializer):
    class Meta:
        ref_name = "FolderPathQuery"

    # Blank passes here so that ``clean_path`` says why it is refused.
    path = serializers.CharField(
        max_length=folder_files.MAX_PATH_BYTES,
        allow_blank=True,
        trim_whitespace=False,
        help_text=PATH_HELP,
    )


class OptionalPathQuerySerializer(serializers.Serializer):
    class Meta:
        ref_name = "FolderOptionalPathQuery"

    path = serializers.CharField(
        max_length=folder_files.MAX_PATH_BYTES,
        required=False,
        allow_blank=True,
        default="",
        trim_whitespace=False,
        help_text=PATH_HELP + " Empty or absent: the folder itself.",
    )


def _path_query(request: Request, *, allow_root: bool, new: bool = False) -> tuple[str, ...]:
    serializer = OptionalPathQuerySerializer if allow_root else PathQuerySerializer
    return folder_files.clean_path(
        _query(request, serializer)["path"], allow_root=allow_root, new=new
    )


class FileEntrySerializer(serializers.Serializer):
    name = serializers.CharField()
    path = serializers.CharField()
    type = serializers.ChoiceField(choices=["file", "dir", "symlink", "other"])
    size = serializers.IntegerField(help_text="Bytes of a regular file; 0 for anything else.")
    modified = serializers.DateTimeField()


class FolderFilesApi(APIView):
    @extend_schema(
        parameters=[OptionalPathQuerySerializer],
        responses=inline_serializer(
            "FolderListing",
            {
                "path": serializers.CharField(),
                "entries": FileEntrySerializer(many=True),
                "truncated": serializers.BooleanField(
                    help_text=f"More than {folder_files.MAX_LIST_ENTRIES} entries: cut there."
                ),
            },
        ),
    )
    def get(self, request: Request, folder_id: int) -> Response:
        """A directory's entries, directories first then by name. Symbolic links
        are listed as "symlink" and never followed."""
        access = selectors.get_folder_for_user(user=request.user, folder_id=folder_id)
        parts = _path_query(request, allow_root=True)
        entries, truncated = folder_files.list_dir(access.folder.host_path, parts)
        tz = datetime.UTC
        return Response(
            {
                "path": "/".join(parts),
                "entries": [
                    {
                        "name": e.name,
                        "path": e.path,
                        "type": e.type,
                        "size": e.size,
                        "modified": datetime.datetime.fromtimestamp(e.modified, tz).isoformat(),
                    }
                    for e in entries
                ],
                "truncated": truncated,
            }
        )

    @extend_schema(parameters=[PathQuerySerializer], responses={204: None})
    def delete(self, request: Request, folder_id: int) -> Response:
        """Delete a file, a directory (with everything in it) or a link (never its target)."""
        access = selectors.get_folder_for_user(user=request.user, folder_id=folder_id)
        access.require_write()
        folder_files.remove(access.folder.host_path, _path_query(request, allow_root=False))
        return Response(status=status.HTTP_204_NO_CONTENT)


MAX_UPLOAD_BYTES = 1024**4  # 1 TiB: past every sensible quota; bounds Content-Length


def _content_length(request: Request) -> int | None:
    raw = request.META.get("CONTENT_LENGTH") or ""
    if raw == "":
        return None
    if not raw.isdigit() or len(raw) > 15:
        raise InvalidInput(f"Content-Length: {raw[:32]!r} is not a byte count")
    length = int(raw)
    if length > MAX_UPLOAD_BYTES:
        raise PayloadTooLarge(
            f"Upload refused: {units.format_size_rounded(length)} is more than one upload may "
            f"carry ({units.format_size_rounded(MAX_UPLOAD_BYTES)})."
        )
    return length


async def _stream(chunks: Iterator[bytes], batch: int = folder_files.CHUNK) -> AsyncIterator[bytes]:
    """A blocking chunk source (a file, a zip being made) served from the event
    loop: each batch is pulled in a worker thread, so neither the loop nor the
    single thread of sync views waits on the disk, and nothing is gathered in
    memory beyond one batch (Django would turn a sync iterator into a list)."""

    def pull() -> bytes:
        out, size = [], 0
        for chunk in chunks:
            out.append(chunk)
            size += len(chunk)
            if size >= batch:
                break
        return b"".join(out)

    try:
        while data := await asyncio.to_thread(pull):
            yield data
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            await asyncio.to_thread(close)


class FolderFileContentApi(AsyncApiView):
    @extend_schema(
        parameters=[PathQuerySerializer],
        responses={
            (200, "application/octet-stream"): OpenApiResponse(
                OpenApiTypes.BINARY, description="The file, as an attachment."
            )
        },
    )
    async def get(self, request: Request, folder_id: int) -> StreamingHttpResponse:
        """Download a file. A symbolic link anywhere on the path: 404 saying so."""
        access = await db(selectors.get_folder_for_user)(user=request.user, folder_id=folder_id)
        parts = _path_query(request, allow_root=False)
        fd, size = await asyncio.to_thread(folder_files.open_file, access.folder.host_path, parts)
        response = StreamingHttpResponse(
            _stream(folder_files.read_chunks(fd)), content_type="application/octet-stream"
        )
        response["Content-Length"] = str(size)
        response["Content-Disposition"] = _attachment(parts[-1])
        return response

    @extend_schema(
        parameters=[PathQuerySerializer],
        request={"application/octet-stream": OpenApiTypes.BINARY},
        responses={
            201: inline_serializer(
                "FolderUpload",
                {"path": serializers.CharField(), "size": serializers.IntegerField()},
            ),
            **errors(409, 413),
        },
    )
    async def put(self, request: Request, folder_id: int) -> Response:
        """Upload a file: the body is its bytes, streamed to disk (parents made; an
        existing file replaced once the upload is complete; a failed one leaves
        nothing). Past the owner's byte quota: 413 with the figures, before
        reading when Content-Length is given, else as soon as the stream passes it."""
        access = await db(selectors.get_folder_for_user)(user=request.user, folder_id=folder_id)
        parts = _path_query(request, allow_root=False, new=True)
        length = _content_length(request)
        allowance = await db(services.folder_upload_allowance)(
            access=access, user=request.user, parts=parts
        )
        body = request._request
        size = await asyncio.to_thread(
            services.folder_file_write,
            folder=access.folder,
            parts=parts,
            chunks=iter(lambda: body.read(folder_files.CHUNK), b""),
            allowance=allowance,
            length=length,
        )
        await db(services.folder_measure)(folder=access.folder)
        return Response({"path": "/".join(parts), "size": size}, status=status.HTTP_201_CREATED)


class FolderArchiveApi(AsyncApiView):
    @extend_schema(
        parameters=[OptionalPathQuerySerializer],
        responses={
            (200, "application/zip"): OpenApiResponse(
                OpenApiTypes.BINARY,
                description="A zip of the directory (stored), made as it is sent; links skipped.",
            )
        },
    )
    async def get(self, request: Request, folder_id: int) -> StreamingHttpResponse:
        """The folder, or a directory in it, as a zip streamed on the fly."""
        access = await db(selectors.get_folder_for_user)(user=request.user, folder_id=folder_id)
        parts = _path_query(request, allow_root=True)
        root = access.folder.host_path
        # Refuse a missing directory or a link before the answer starts.
        await asyncio.to_thread(folder_files.check_dir, root, parts)
        response = StreamingHttpResponse(
            _stream(folder_files.zip_chunks(root, parts)), content_type="application/zip"
        )
        response["Content-Disposition"] = _attachment(f"{(parts or (access.folder.name,))[-1]}.zip")
        return response


class FolderMkdirApi(APIView):
    class InputSerializer(StrictInputSerializer):
        class Meta:
            ref_name = "FolderMkdirInput"

        path = serializers.CharField(
            max_length=folder_files.MAX_PATH_BYTES, trim_whitespace=False, help_text=PATH_HELP
        )

    @extend_schema(
        request=InputSerializer,
        responses={
            201: inline_serializer("FolderMkdir", {"path": serializers.CharField()}),
            **errors(409),
        },
    )
    def post(self, request: Request, folder_id: int) -> Response:
        """Make a directory (and any missing parents)."""
        access = selectors.get_folder_for_user(user=request.user, folder_id=folder_id)
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        parts = folder_files.clean_path(data.validated_data["path"], new=True)
        access.require_write()
        folder_files.make_dir(access.folder.host_path, parts)
        return Response({"path": "/".join(parts)}, status=status.HTTP_201_CREATED)


class FolderRenameApi(APIView):
    class InputSerializer(StrictInputSerializer):
        class Meta:
            ref_name = "FolderRenameInput"

        path = serializers.CharField(
            max_length=folder_files.MAX_PATH_BYTES, trim_whitespace=False, help_text=PATH_HELP
        )
        new_path = serializers.CharField(
            max_length=folder_files.MAX_PATH_BYTES, trim_whitespace=False, help_text=PATH_HELP
        )

    @extend_schema(
        request=InputSerializer,
        responses={
            200: inline_serializer(
                "FolderRename",
                {"path": serializers.CharField(), "new_path": serializers.CharField()},
            ),
            **errors(409),
        },
    )
    def post(self, request: Request, folder_id: int) -> Response:
        """Move a file, directory or link within the folder; the new path must not exist."""
        access = selectors.get_folder_for_user(user=request.user, folder_id=folder_id)
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        src = folder_files.clean_path(data.validated_data["path"])
        dst = folder_files.clean_path(data.validated_data["new_path"], field="new_path", new=True)
        access.require_write()
        folder_files.rename(access.folder.host_path, src, dst)
        return Response({"path": "/".join(src), "new_path": "/".join(dst)})


class FolderSharesOutSerializer(serializers.Serializer):
    shares = FolderShareSerializer(many=True)
    detail = serializers.CharField()


def _shares_out(folder: DataFolder) -> dict[str, Any]:
    shares = folder.shares.select_related("user").order_by("user__username")
    return {
        "shares": FolderShareSerializer(shares, many=True).data,
        "detail": services.REVOKE_NOTE,
    }


class FolderSharesApi(APIView):
    class InputSerializer(StrictInputSerializer):
        class Meta:
            ref_name = "FolderShareInput"

        user = serializers.CharField(max_length=150, trim_whitespace=False)
        permission = serializers.ChoiceField(choices=FolderPermission.choices)

    @extend_schema(responses=FolderSharesOutSerializer)
    def get(self, request: Request, folder_id: int) -> Response:
        """Who the folder is shared with. Owner or admin."""
        access = selectors.get_folder_for_user(user=request.user, folder_id=folder_id)
        access.require_manage()
        return Response(_shares_out(access.folder))

    @extend_schema(request=InputSerializer, responses={201: FolderSharesOutSerializer})
    def post(self, request: Request, folder_id: int) -> Response:
        """Share with a user, read-only or read-write (again: change the permission)."""
        access = selectors.get_folder_for_user(user=request.user, folder_id=folder_id)
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        access.require_manage()
        services.folder_share_set(
            folder=access.folder,
            username=data.validated_data["user"],
            permission=data.validated_data["permission"],
        )
        return Response(_shares_out(access.folder), status=status.HTTP_201_CREATED)


class FolderShareDeleteApi(APIView):
    @extend_schema(responses={204: None})
    def delete(self, request: Request, folder_id: int, username: str) -> Response:
        """Revoke a share: sessions started from now on no longer get the folder."""
        access = selectors.get_folder_for_user(user=request.user, folder_id=folder_id)
        access.require_manage()
        services.folder_share_revoke(folder=access.folder, username=username)
        return Response(status=status.HTTP_204_NO_CONTENT)


# --- catalogue ----------------------------------------------------------------


class ImageSerializer(serializers.Serializer):
    reference = serializers.CharField()
    display_name = serializers.CharField()
    description = serializers.CharField()
    min_slots = serializers.JSONField()
    supports_ssh = serializers.BooleanField()
    serve_command = serializers.CharField(
        help_text="What an inference endpoint's replicas run when it gives no start command; "
        "empty: it must give one."
    )
    allowed_groups = serializers.SerializerMethodField()

    def get_allowed_groups(self, obj: Any) -> list[str]:
        return [g.name for g in obj.allowed_groups.all()]


class ImageListApi(APIView):
    @extend_schema(responses=ImageSerializer(many=True))
    def get(self, request: Request) -> Response:
        return Response(
            ImageSerializer(selectors.images_for_user(user=request.user), many=True).data
        )


class PresetSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    description = serializers.CharField()
    resources = SlotAmountsField(source="resource_slots", help_text="Per container.")
    resource_group = serializers.CharField(
        source="resource_group.name", allow_null=True, help_text="null: offered in every group."
    )
    text = serializers.SerializerMethodField(help_text='For people, e.g. "1 cpu, 2 GiB mem".')

    def get_text(self, obj: ResourcePreset) -> str:
        return ", ".join(
            slotlib.fmt(slot, value)
            for slot, value in slotlib.from_strings(obj.resource_slots).items()
        )


class PresetListApi(APIView):
    @extend_schema(
        parameters=[
            OpenApiParameter(
                "resource_group", str, description="Only the presets offered in this group."
            )
        ],
        responses=PresetSerializer(many=True),
    )
    def get(self, request: Request) -> Response:
        group = None
        if name := request.query_params.get("resource_group"):
            group = selectors.resource_groups_for_user(user=request.user).filter(name=name).first()
            if group is None:
                raise field_error("resource_group", f"unknown resource group {name!r}")
        presets = selectors.presets_for_user(user=request.user, group=group)
        return Response(PresetSerializer(presets, many=True).data)


class ResourceGroupSerializer(serializers.Serializer):
    name = serializers.CharField()
    description = serializers.CharField()
    session_selection = serializers.CharField()
    agent_selection = serializers.CharField()
    allowed_session_types = serializers.JSONField()
    pending_timeout = serializers.DurationField(allow_null=True)


class ResourceGroupListApi(APIView):
    @extend_schema(responses=ResourceGroupSerializer(many=True))
    def get(self, request: Request) -> Response:
        groups = selectors.resource_groups_for_user(user=request.user)
        return Response(ResourceGroupSerializer(groups, many=True).data)


class AgentSerializer(serializers.Serializer):
    id = serializers.CharField()
    resource_group = serializers.CharField(source="resource_group.name")
    status = serializers.CharField()
    status_reason = serializers.CharField()
    schedulable = serializers.BooleanField()
    backend = serializers.CharField()
    hostname = serializers.CharField()
    capacity_slots = serializers.JSONField()
    occupied_slots = serializers.JSONField()
    labels = serializers.JSONField()
    last_heartbeat_at = serializers.DateTimeField(allow_null=True)


class AgentListApi(APIView):
    permission_classes = [IsAdminUser]

    @extend_schema(responses=AgentSerializer(many=True))
    def get(self, request: Request) -> Response:
        from .models import Agent

        return Response(
            AgentSerializer(Agent.objects.select_related("resource_group"), many=True).data
        )
