"""Customer billing pages, mounted at /billing/ by the root URLconf."""
from django.urls import path
from django.views.generic import RedirectView

from rental.teams.rights import customer_view

from . import views

app_name = "billing"

urlpatterns = [
    path("", customer_view("view")(RedirectView.as_view(pattern_name="billing:invoices")), name="index"),
    path("invoices/", views.invoice_list, name="invoices"),
    path("invoices/<int:invoice_id>/", views.invoice_detail, name="invoice"),
    path("invoices/<int:invoice_id>/pay/", views.invoice_pay, name="invoice_pay"),
    path("invoices/<int:invoice_id>/demo-pay/", views.invoice_pay_demo_view, name="invoice_pay_demo"),
    path("balance/", views.balance, name="balance"),
    path("leases/<int:lease_id>/refund/", views.refund, name="lease_refund"),
    path("leases/<int:lease_id>/extend/", views.lease_extend, name="lease_extend"),
]
