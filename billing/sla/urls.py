"""SLA claims, mounted with `path("billing/sla/", include("billing.sla.urls"))`."""
from django.urls import path

from . import views

app_name = "sla"

urlpatterns = [
    path("", views.sla_claims, name="claims"),
]
