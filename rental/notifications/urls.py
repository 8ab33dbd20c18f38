from django.urls import path

from . import views

urlpatterns = [
    path("", views.webhook_save, name="webhook_save"),
    path("rotate/", views.webhook_rotate, name="webhook_rotate"),
    path("delete/", views.webhook_delete, name="webhook_delete"),
    path("test/", views.webhook_test, name="webhook_test"),
    path("deliveries/<int:delivery_id>/redeliver/", views.webhook_redeliver, name="webhook_redeliver"),
]
