from django import template
from django.utils import timezone

from storage.dashboard import storage_panel as _panel

register = template.Library()


@register.inclusion_tag("admin/storage/_panel.html")
def storage_panel():
    return {"panel": _panel(timezone.now())}


@register.inclusion_tag("storage/_lease_volumes.html")
def lease_volumes(lease):
    """The network volumes attached to a lease, each with its mount as the node reported it."""
    from rental.models import VolumeAttachment
    from storage.models import OrderedVolume, VolumeMount

    rows = list(VolumeAttachment.objects.filter(lease=lease, detached_at__isnull=True).select_related("volume"))
    mounts = {m.volume_id: m for m in VolumeMount.objects.filter(lease=lease)}
    return {"rows": [{"volume": a.volume, "mount": mounts.get(a.volume_id)} for a in rows],
            "ordered": OrderedVolume.objects.filter(lease=lease).first()}
