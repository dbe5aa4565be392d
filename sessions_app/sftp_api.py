"""The REST API of SFTP system sessions and users' SSH keys (logic in ``sftp.py``)."""

from __future__ import annotations

from django.http import HttpResponse
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from . import selectors, sftp
from .api import SessionDetailSerializer, StrictInputSerializer, _attachment
from .openapi import errors

# --- SFTP sessions ------------------------------------------------------------------------------


class SftpSessionCreateApi(APIView):
    class InputSerializer(StrictInputSerializer):
        class Meta:
            ref_name = "SftpSessionCreateInput"

        folders = serializers.ListField(
            child=serializers.IntegerField(min_value=1),
            min_length=1,
            max_length=sftp.MAX_SFTP_FOLDERS,
            help_text="Ids of your folders, or of folders shared with you (read-only shares "
            "are served read-only).",
        )
        resource_group = serializers.CharField(
            required=False,
            max_length=64,
            help_text="A group that allows system sessions (default: the first that does).",
        )

    @extend_schema(
        request=InputSerializer,
        responses={201: SessionDetailSerializer, **errors(400, 409)},
        description="Start an SFTP system session on the chosen folders. It counts against "
        "max_concurrent_sftp_sessions only and never waits: over the limit, or failing any "
        "check, it is CANCELLED at once with the reason (status_reason).",
    )
    def post(self, request: Request) -> Response:
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        session = sftp.sftp_session_create(
            owner=request.user,
            folder_ids=data.validated_data["folders"],
            resource_group=data.validated_data.get("resource_group"),
        )
        session = selectors.get_session_for_user(user=request.user, session_id=session.pk)
        return Response(SessionDetailSerializer(session).data, status=status.HTTP_201_CREATED)


class SftpInfoSerializer(serializers.Serializer):
    status = serializers.CharField()
    status_reason = serializers.CharField()
    host = serializers.CharField(allow_null=True, help_text="Null until the session runs.")
    port = serializers.IntegerField(allow_null=True, help_text="Null until the session runs.")
    user = serializers.CharField()
    folders = serializers.ListField(child=serializers.CharField())
    readonly_folders = serializers.ListField(child=serializers.CharField())
    host_key_fingerprint = serializers.CharField(allow_null=True)
    command = serializers.CharField()
    scp_command = serializers.CharField()
    authorized_keys = serializers.ListField(
        child=serializers.CharField(),
        help_text='"session key" (the private key download) and the names of your SSH keys.',
    )


class SessionSftpApi(APIView):
    @extend_schema(responses={200: SftpInfoSerializer, **errors(404)})
    def get(self, request: Request, session_id: str) -> Response:
        session = selectors.get_session_for_user(user=request.user, session_id=session_id)
        return Response(SftpInfoSerializer(sftp.sftp_session_info(session=session)).data)


class SessionSftpKeyApi(APIView):
    @extend_schema(
        responses={
            (200, "application/x-pem-file"): OpenApiResponse(
                description="The session's private key (OpenSSH format); save it 0600."
            ),
            **errors(404),
        }
    )
    def get(self, request: Request, session_id: str) -> HttpResponse:
        session = selectors.get_session_for_user(user=request.user, session_id=session_id)
        key = sftp.sftp_private_key(session=session)
        response = HttpResponse(key, content_type="application/x-pem-file")
        response["Content-Disposition"] = _attachment(f"{session.name}.key")
        response["Cache-Control"] = "no-store"
        return response


# --- SSH keys -----------------------------------------------------------------------------------


class SSHKeySerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    public_key = serializers.CharField()
    fingerprint = serializers.CharField(help_text="SHA256:… as ssh-keygen -l prints it.")
    created_at = serializers.DateTimeField()


class SSHKeyListCreateApi(APIView):
    class InputSerializer(StrictInputSerializer):
        class Meta:
            ref_name = "SSHKeyCreateInput"

        name = serializers.CharField(max_length=sftp.SSH_KEY_NAME_MAX, trim_whitespace=True)
        public_key = serializers.CharField(
            max_length=16 * 1024,
            trim_whitespace=True,
            help_text="One OpenSSH public key line: ssh-ed25519, ecdsa-sha2-nistp256/384/521, "
            "or ssh-rsa of at least 2048 bits.",
        )

    @extend_schema(responses=SSHKeySerializer(many=True))
    def get(self, request: Request) -> Response:
        keys = sftp.ssh_keys_for_user(user=request.user)
        return Response(SSHKeySerializer(keys, many=True).data)

    @extend_schema(request=InputSerializer, responses={201: SSHKeySerializer, **errors(400, 409)})
    def post(self, request: Request) -> Response:
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        key = sftp.ssh_key_create(
            owner=request.user,
            name=data.validated_data["name"],
            public_key=data.validated_data["public_key"],
        )
        return Response(SSHKeySerializer(key).data, status=status.HTTP_201_CREATED)


class SSHKeyDeleteApi(APIView):
    @extend_schema(responses={204: None, **errors(404)})
    def delete(self, request: Request, key_id: int) -> Response:
        sftp.ssh_key_delete(owner=request.user, key_id=key_id)
        return Response(status=status.HTTP_204_NO_CONTENT)
