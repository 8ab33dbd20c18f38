from django.urls import path

from . import customer_views

urlpatterns = [
    path("<slug:action>/", customer_views.instance_action, name="instance_action"),
]
