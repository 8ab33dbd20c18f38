"""The localized pages' lists: the public pages and the customer's pages to render in each language."""
from django.urls import reverse

PUBLIC = [
    ("home", []), ("catalog", []), ("gpu_detail", ["rtx-3090"]), ("links", []), ("storage", []),
    ("faq", []), ("sizing", []), ("sizing_tables", []), ("signup", []), ("login", []),
]


def customer_urls(shop) -> dict[str, str]:
    return {
        "order": reverse("order", args=["rtx-3090"]),
        "lease_list": reverse("lease_list"),
        "lease_detail": reverse("lease_detail", args=[shop["lease"].pk]),
        "invoices": reverse("billing:invoices"),
        "invoice": reverse("billing:invoice", args=[shop["invoice"].pk]),
        "balance": reverse("billing:balance"),
        "account_settings": reverse("account_settings"),
        "password_change": reverse("password_change"),
        "pay": reverse("payments:invoice", args=[shop["invoice"].pk]),
        "quote": reverse("payments:quote", args=[shop["quote"].pk]),
        "sla_claims": reverse("sla:claims"),
    }
