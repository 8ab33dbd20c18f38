"""Crypto payment pages; the root URLconf mounts them at /pay/."""
from django.urls import path

from . import views

app_name = "payments"

urlpatterns = [
    path("invoice/<int:invoice_id>/", views.invoice_pay, name="invoice"),
    path("quote/<int:quote_id>/", views.quote_detail, name="quote"),
    path("quote/<int:quote_id>/demo-wallet/", views.quote_pay_demo, name="demo_wallet"),
    path("quote/<int:quote_id>/use-late-payment/", views.quote_confirm_late, name="confirm_late"),
]
