from django.urls import path

from . import customer_views

urlpatterns = [
    path("sanitization-record.json", customer_views.sanitization_record_download, name="sanitization_record"),
    path("sanitization-record/", customer_views.sanitization_record_page, name="sanitization_record_page"),
    path("restore/", customer_views.instance_restore_view, name="instance_restore"),
    path("<slug:action>/", customer_views.instance_action, name="instance_action"),
]
