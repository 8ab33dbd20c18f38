"""The customer's storage page (/storage/mine/): network volumes and snapshots, ordering
them from the balance, attaching/detaching volumes, taking/restoring snapshots, deleting.
Here (billing) because ordering charges money; rental.storage does the writes. Refusals
are checked first with a translated message, so rental's English text is only a fallback."""
from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from billing.ledger import InsufficientBalance, account_for
from inventory.models import Site, StorageProduct
from rental.models import Lease, LeaseState, NetworkVolume, Snapshot, VolumeAttachment
from rental.storage import StorageRefused, storage_delete, volume_attach, volume_detach
from rental.teams.rights import customer_view

from .charges import snapshot_order, volume_order
from .models import SnapshotMeter
from .snapshot_usage import snapshot_charges_of
from .views import storage_context
from .volumes import volume_attachments_changed, volume_store_purge_start

S = LeaseState
ATTACHABLE = (S.PROVISIONING, S.ACTIVE)  # rental.storage: volumes attach to running leases
SNAPSHOTTABLE = (S.ACTIVE, S.SUSPENDED)
MAX_TB = 100


class VolumeForm(forms.Form):
    site = forms.ModelChoiceField(label=gettext_lazy("Site"), queryset=Site.objects.filter(is_active=True),
                                  to_field_name="code", empty_label=None)
    size_tb = forms.IntegerField(label=gettext_lazy("Size (TB)"), min_value=1, max_value=MAX_TB, initial=1)
    name = forms.CharField(label=gettext_lazy("Name"), max_length=60, initial="data")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["site"].label_from_instance = lambda site: f"{site.code} ({site.name}, {site.region})"


class SnapshotForm(forms.Form):
    lease = forms.ModelChoiceField(label=gettext_lazy("Lease"), queryset=Lease.objects.none(), empty_label=None)
    size_tb = forms.IntegerField(label=gettext_lazy("Size (TB)"), min_value=1, max_value=MAX_TB, initial=1)

    def __init__(self, *args, customer, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["lease"].queryset = _leases(customer).filter(state__in=SNAPSHOTTABLE)
        self.fields["lease"].label_from_instance = _lease_label


def _lease_label(lease: Lease) -> str:
    return f"#{lease.pk} {lease.offer.display_name} ({lease.site.code})"


def _leases(customer):
    return Lease.objects.filter(customer=customer).select_related("offer__gpu_model", "site")


def _volumes(customer):
    return NetworkVolume.objects.filter(customer=customer).exclude(state=NetworkVolume.State.DELETED)


def _snapshots(customer):
    return Snapshot.objects.filter(customer=customer).exclude(state=Snapshot.State.DELETED)


def _price(kind: str) -> int | None:
    product = StorageProduct.objects.filter(kind=kind).first()
    return product.cents_per_tb_month if product else None


def _page(request, *, volume_form=None, snapshot_form=None, status=200):
    user = request.account
    running = list(_leases(user).filter(state__in=ATTACHABLE))
    volumes = list(_volumes(user).select_related("site"))
    attached = {}
    for a in VolumeAttachment.objects.filter(volume__in=volumes, detached_at__isnull=True).select_related(
            "lease__offer__gpu_model", "lease__site"):
        attached.setdefault(a.volume_id, []).append(a.lease)
    ceph = storage_context(user)
    volume_rows = []
    for v in volumes:
        on = attached.get(v.pk, [])
        for lease in on:
            lease.mount = ceph["mounts"].get((v.pk, lease.pk))
        ids = {lease.pk for lease in on}
        targets = [lease for lease in running if lease.site_id == v.site_id and lease.pk not in ids]
        volume_rows.append({"volume": v, "leases": on, "targets": targets})
    billed = dict(SnapshotMeter.objects.filter(snapshot__customer=user).values_list("snapshot_id", "billed_until"))
    # A snapshot replaces a lease's disk from the lease's page, at the snapshot's site, while the
    # instance is stopped (fleet.services.instance_restore): the one rule, listed here as links.
    restorable_onto = list(_leases(user).filter(state__in=(S.ACTIVE, S.SUSPENDED)).select_related("site"))
    snapshot_rows = [
        {"snapshot": s, "billed_until": billed.get(s.pk),
         "targets": [lease for lease in restorable_onto if lease.site_id == s.site_id]}
        for s in _snapshots(user).select_related("site", "source_lease__offer__gpu_model", "source_lease__site")]
    context = {
        "volume_rows": volume_rows, "snapshot_rows": snapshot_rows,
        "volume_form": volume_form or VolumeForm(),
        "snapshot_form": snapshot_form or SnapshotForm(customer=user),
        "balance_cents": account_for(user).balance_cents,
        "volume_price": _price(StorageProduct.Kind.NETWORK_VOLUME), "snapshot_price": _price(StorageProduct.Kind.SNAPSHOT),
        "object_price": settings.OBJECT_STORAGE_CENTS_PER_TB_MONTH,
        "snapshot_charges": snapshot_charges_of(user),
        **ceph,
    }
    return render(request, "storage/mine.html", context, status=status)


def _short_balance(request, exc: InsufficientBalance):
    messages.error(request, format_html(
        '{} {} <a href="{}">{}</a>', exc, _("Nothing was ordered."), reverse("billing:balance"),
        _("Top up your balance")))


def _back():
    return redirect("storage_mine:index")


# --- the rules both channels apply (this page and storage.api), with their messages ---

def volume_attach_refusal(volume: NetworkVolume, lease: Lease) -> str | None:
    """Why `volume` cannot be attached to `lease` now, or None."""
    if volume.state != NetworkVolume.State.ACTIVE:
        return _("Volume “%(name)s” is %(state)s; it cannot be attached.") % {
            "name": volume.name, "state": volume.get_state_display()}
    if lease.site_id != volume.site_id:
        return _("Volume “%(name)s” is at %(vsite)s and lease #%(id)d at %(lsite)s: a volume "
                 "attaches only to leases at its own site.") % {
            "name": volume.name, "vsite": volume.site.code, "id": lease.pk, "lsite": lease.site.code}
    if lease.state not in ATTACHABLE:
        return _("Lease #%(id)d is %(state)s; volumes attach only to running leases.") % {
            "id": lease.pk, "state": lease.get_state_display()}
    return None


@customer_view("view")
@login_required
@require_GET
def index(request):
    return _page(request)


@customer_view("order")
@login_required
@require_POST
def volume_create(request):
    form = VolumeForm(request.POST)
    if not form.is_valid():
        return _page(request, volume_form=form, status=400)
    data = form.cleaned_data
    try:
        volume = volume_order(customer=request.account, site=data["site"], name=data["name"], size_tb=data["size_tb"],
                              now=timezone.now())
    except InsufficientBalance as exc:
        _short_balance(request, exc)
        return _page(request, volume_form=form, status=400)
    except StorageRefused as exc:
        messages.error(request, _("Refused: %(why)s") % {"why": exc})
        return _page(request, volume_form=form, status=400)
    messages.success(request, _("Network volume “%(name)s” ordered: %(size)d TB at %(site)s, paid for 30 days.")
                     % {"name": volume.name, "size": volume.size_tb, "site": volume.site.code})
    return _back()


@customer_view("operate")
@login_required
@require_POST
def volume_attach_view(request, volume_id: int):
    volume = get_object_or_404(_volumes(request.account).select_related("site"), pk=volume_id)
    lease = get_object_or_404(_leases(request.account), pk=_int(request.POST.get("lease")))
    refusal = volume_attach_refusal(volume, lease)
    if refusal:
        messages.error(request, refusal)
    else:
        try:
            volume_attach(volume=volume, lease=lease, now=timezone.now(), actor=request.account)
        except StorageRefused as exc:
            messages.error(request, _("Refused: %(why)s") % {"why": exc})
        else:
            volume_attachments_changed(volume=volume, now=timezone.now())
            messages.success(request, _("Volume “%(name)s” attached to lease #%(id)d.")
                             % {"name": volume.name, "id": lease.pk})
    return _back()


@customer_view("operate")
@login_required
@require_POST
def volume_detach_view(request, volume_id: int, lease_id: int):
    volume = get_object_or_404(_volumes(request.account), pk=volume_id)
    lease = get_object_or_404(_leases(request.account), pk=lease_id)
    if volume_detach(volume=volume, lease_id=lease.pk, now=timezone.now(), actor=request.account):
        volume_attachments_changed(volume=volume, now=timezone.now())
        messages.success(request, _("Volume “%(name)s” detached from lease #%(id)d.")
                         % {"name": volume.name, "id": lease.pk})
    else:
        messages.error(request, _("Volume “%(name)s” is not attached to lease #%(id)d.")
                       % {"name": volume.name, "id": lease.pk})
    return _back()


@customer_view("operate")
@login_required
@require_POST
def snapshot_create(request):
    form = SnapshotForm(request.POST, customer=request.account)
    lease_id = _int(request.POST.get("lease"))
    if lease_id is not None:  # someone else's lease is a 404, not a form error
        get_object_or_404(_leases(request.account), pk=lease_id)
    if not form.is_valid():
        return _page(request, snapshot_form=form, status=400)
    lease = form.cleaned_data["lease"]
    try:
        snap = snapshot_order(lease=lease, size_tb=form.cleaned_data["size_tb"], now=timezone.now(),
                              actor=request.account)
    except InsufficientBalance as exc:
        _short_balance(request, exc)
        return _page(request, snapshot_form=form, status=400)
    except StorageRefused as exc:
        messages.error(request, _("Refused: %(why)s") % {"why": exc})
        return _page(request, snapshot_form=form, status=400)
    if snap.state == Snapshot.State.CREATING:
        messages.success(request, _("Snapshot #%(id)d of lease #%(lease)d is being taken (up to %(size)d TB). Its "
                                    "progress shows below; it is ready once the node has copied the disk, and billed "
                                    "for what it stores from then on.")
                         % {"id": snap.pk, "lease": lease.pk, "size": snap.size_tb})
    else:
        messages.success(request, _("Snapshot #%(id)d of lease #%(lease)d taken (up to %(size)d TB); it is billed "
                                    "for what it stores.")
                         % {"id": snap.pk, "lease": lease.pk, "size": snap.size_tb})
    return _back()


def _delete(request, obj, *, done: str):
    if request.method == "GET":
        return render(request, "storage/confirm_delete.html",
                      {"obj": obj, "is_volume": isinstance(obj, NetworkVolume)})
    if storage_delete(obj=obj, now=timezone.now(), actor=request.account, reason="deleted by the customer"):
        if isinstance(obj, NetworkVolume):
            volume_attachments_changed(volume=obj, now=timezone.now())
            volume_store_purge_start(volume=obj, now=timezone.now())
        messages.success(request, done)
    return _back()


@customer_view({"GET": "view", "POST": "operate"})
@login_required
@require_http_methods(["GET", "POST"])
def volume_delete(request, volume_id: int):
    volume = get_object_or_404(_volumes(request.account).select_related("site"), pk=volume_id)
    return _delete(request, volume, done=_("Volume “%(name)s” deleted.") % {"name": volume.name})


@customer_view({"GET": "view", "POST": "operate"})
@login_required
@require_http_methods(["GET", "POST"])
def snapshot_delete(request, snapshot_id: int):
    snap = get_object_or_404(_snapshots(request.account), pk=snapshot_id)
    return _delete(request, snap, done=_("Snapshot #%(id)d deleted.") % {"id": snap.pk})


def _int(value) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None
