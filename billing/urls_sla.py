"""SLA claims, mounted with `path("billing/sla/", include("billing.urls_sla"))`."""
from django.urls import path

from . import views_sla

app_name = "sla"

urlpatterns = [
    path("", views_sla.sla_claims, name="claims"),
]
