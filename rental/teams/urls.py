"""Mounted at /account/team/ by the root URLconf."""
from django.urls import path

from . import views

urlpatterns = [
    path("", views.team, name="team"),
    path("invite/", views.team_invite, name="team_invite"),
    path("role/", views.team_role, name="team_role"),
    path("remove/", views.team_remove, name="team_remove"),
    path("leave/", views.team_leave, name="team_leave"),
    path("invitations/<int:invitation_id>/revoke/", views.team_invitation_revoke, name="team_invitation_revoke"),
    path("join/<str:token>/", views.team_join, name="team_join"),
]
