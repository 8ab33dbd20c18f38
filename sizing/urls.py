from django.urls import path

from . import api, views

urlpatterns = [
    path("size/", views.calculator, name="sizing"),
    path("size/tables/", views.tables, name="sizing_tables"),
    path("api/v1/estimate", api.estimate, name="api_estimate"),
]
