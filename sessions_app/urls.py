from django.contrib.auth import views as auth_views
from django.urls import path

from . import views

urlpatterns = [
    path("login/", auth_views.LoginView.as_view(template_name="login.html"), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("profile/", views.profile, name="profile"),
    path("profile/tokens/", views.profile_token_create, name="profile-token-create"),
    path(
        "profile/tokens/<str:token_id>/revoke/",
        views.profile_token_revoke,
        name="profile-token-revoke",
    ),
    path("folders/", views.folder_list, name="folder-list"),
    path("folders/<int:folder_id>/", views.folder_browse, name="folder-browse"),
    path("templates/", views.template_list, name="template-list"),
    path("templates/new/", views.template_new, name="template-new"),
    path("templates/<int:template_id>/edit/", views.template_edit, name="template-edit"),
    path("", views.session_list, name="session-list"),
    path("sessions/new/", views.session_new, name="session-new"),
    path("sessions/<str:session_id>/", views.session_detail, name="session-detail"),
    path("sessions/<str:session_id>/terminal/", views.session_terminal, name="session-terminal"),
]
