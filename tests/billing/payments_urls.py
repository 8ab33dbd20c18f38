"""The root URLconf plus /pay/ (until storefront/urls.py mounts billing.payments.urls itself)."""
from django.urls import include, path

from storefront.urls import urlpatterns as root

mounted = any(getattr(p, "namespace", None) == "payments" for p in root)
urlpatterns = root if mounted else [path("pay/", include("billing.payments.urls")), *root]
