"""Who runs the store, for the footer of every page (operator settings)."""
from django.conf import settings


def operator(request) -> dict:
    return {"OPERATOR_NAME": settings.OPERATOR_NAME, "OPERATOR_CONTACT": settings.OPERATOR_CONTACT,
            "DEMO_PAYMENTS": settings.DEMO_PAYMENTS}
