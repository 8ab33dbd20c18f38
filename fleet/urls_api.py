"""Mounted by the root URLconf at /api/v1/leases/<id>/sanitization-record (as a string
include: nothing below fleet imports it)."""
from django.urls import path

from . import customer_views

urlpatterns = [
    path("", customer_views.sanitization_record_api, name="api_lease_sanitization_record"),
]
