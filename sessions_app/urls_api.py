from django.urls import path

from . import api, sftp_api

urlpatterns = [
    path("auth/token/", api.TokenCreateApi.as_view(), name="api-token"),
    path("sessions/", api.SessionListCreateApi.as_view(), name="api-sessions"),
    # Before sessions/<id>/, which would take "preview" for an id.
    path("sessions/preview/", api.SessionPreviewApi.as_view(), name="api-session-preview"),
    path("sessions/<str:session_id>/", api.SessionDetailApi.as_view(), name="api-session"),
    path(
        "sessions/<str:session_id>/terminate/",
        api.SessionTerminateApi.as_view(),
        name="api-session-terminate",
    ),
    path(
        "sessions/<str:session_id>/execute/",
        api.SessionExecuteApi.as_view(),
        name="api-session-execute",
    ),
    path("sessions/<str:session_id>/runs/", api.SessionRunsApi.as_view(), name="api-session-runs"),
    path(
        "sessions/<str:session_id>/apps/<str:app>/open/",
        api.SessionAppOpenApi.as_view(),
        name="api-session-app-open",
    ),
    path(
        "sessions/<str:session_id>/kernels/<str:kernel_id>/logs/",
        api.KernelLogsApi.as_view(),
        name="api-kernel-logs",
    ),
    path("templates/", api.TemplateListCreateApi.as_view(), name="api-templates"),
    path("templates/import/", api.TemplateImportApi.as_view(), name="api-template-import"),
    path("templates/<int:template_id>/", api.TemplateDetailApi.as_view(), name="api-template"),
    path(
        "templates/<int:template_id>/export/",
        api.TemplateExportApi.as_view(),
        name="api-template-export",
    ),
    path("folders/", api.FolderListCreateApi.as_view(), name="api-folders"),
    path("folders/quota/", api.FolderQuotaApi.as_view(), name="api-folder-quota"),
    path("folders/<int:folder_id>/", api.FolderDetailApi.as_view(), name="api-folder"),
    path("folders/<int:folder_id>/files/", api.FolderFilesApi.as_view(), name="api-folder-files"),
    path(
        "folders/<int:folder_id>/files/content/",
        api.FolderFileContentApi.as_view(),
        name="api-folder-file-content",
    ),
    path(
        "folders/<int:folder_id>/files/mkdir/",
        api.FolderMkdirApi.as_view(),
        name="api-folder-mkdir",
    ),
    path(
        "folders/<int:folder_id>/files/rename/",
        api.FolderRenameApi.as_view(),
        name="api-folder-rename",
    ),
    path(
        "folders/<int:folder_id>/archive/",
        api.FolderArchiveApi.as_view(),
        name="api-folder-archive",
    ),
    path(
        "folders/<int:folder_id>/shares/", api.FolderSharesApi.as_view(), name="api-folder-shares"
    ),
    path(
        "folders/<int:folder_id>/shares/<str:username>/",
        api.FolderShareDeleteApi.as_view(),
        name="api-folder-share",
    ),
    path("images/", api.ImageListApi.as_view(), name="api-images"),
    path("presets/", api.PresetListApi.as_view(), name="api-presets"),
    path("resource-groups/", api.ResourceGroupListApi.as_view(), name="api-resource-groups"),
    path("agents/", api.AgentListApi.as_view(), name="api-agents"),
    # SFTP system sessions and SSH keys (sftp_api.py)
    path("folders/sftp/", sftp_api.SftpSessionCreateApi.as_view(), name="api-folders-sftp"),
    path(
        "sessions/<str:session_id>/sftp/",
        sftp_api.SessionSftpApi.as_view(),
        name="api-session-sftp",
    ),
    path(
        "sessions/<str:session_id>/sftp/key/",
        sftp_api.SessionSftpKeyApi.as_view(),
        name="api-session-sftp-key",
    ),
    path("ssh-keys/", sftp_api.SSHKeyListCreateApi.as_view(), name="api-ssh-keys"),
    path("ssh-keys/<int:key_id>/", sftp_api.SSHKeyDeleteApi.as_view(), name="api-ssh-key"),
]
