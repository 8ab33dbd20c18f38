"""Mounted by the root URLconf: `urlpatterns` at /leases/<id>/instance/ (the lease page's
buttons and the record), `api_urlpatterns` at /api/v1/leases/<id>/sanitization-record."""
from django.urls import path

from . import views

urlpatterns = [
    path("sanitization-record.json", views.sanitization_record_download, name="sanitization_record"),
    path("sanitization-record/", views.sanitization_record_page, name="sanitization_record_page"),
    path("restore/", views.instance_restore_view, name="instance_restore"),
    path("<slug:action>/", views.instance_action, name="instance_action"),
]

api_urlpatterns = [
    path("", views.sanitization_record_api, name="api_lease_sanitization_record"),
]
