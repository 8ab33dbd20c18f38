"""The node agent's API, mounted at /agent/v1/ (nodeagent/PROTOCOL.md)."""
from django.urls import path

from . import views

urlpatterns = [
    path("enrol", views.enrol, name="agent_enrol"),
    path("desired", views.desired, name="agent_desired"),
    path("desired/watch", views.watch, name="agent_desired_watch"),
    path("report", views.report, name="agent_report"),
    path("report/watch", views.report_watch, name="agent_report_watch"),
]
