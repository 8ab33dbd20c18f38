"""The root URLconf plus the ops includes the lead adds to storefront/urls.py."""
from django.urls import include, path

from storefront.urls import urlpatterns as root

urlpatterns = [path("billing/sla/", include("billing.sla.urls")), *root]
