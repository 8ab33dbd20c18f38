from django import template
from django.utils import timezone

from billing.storage.dashboard import storage_panel as _panel

register = template.Library()


@register.inclusion_tag("admin/storage/_panel.html")
def storage_panel():
    return {"panel": _panel(timezone.now())}
