"""The storage page's Ceph parts (/storage/mine/): growing a volume, and object storage —
opening the site's S3 account with a quota, keys shown once, rotate and revoke."""
from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from django.views.decorators.http import require_POST

from billing.ledger import InsufficientBalance
from inventory.models import Site
from rental.models import NetworkVolume
from rental.storage import StorageRefused
from rental.teams.rights import customer_view

from .charges import volume_grow_order
from .models import S3Account, S3Key, StorageCluster, VolumeMount
from .objects import s3_account_open, s3_endpoint, s3_key_create, s3_key_revoke, s3_key_rotate

MAX_TB = 100


class GrowForm(forms.Form):
    size_tb = forms.IntegerField(label=gettext_lazy("New size (TB)"), min_value=2, max_value=MAX_TB)


class S3AccountForm(forms.Form):
    site = forms.ModelChoiceField(label=gettext_lazy("Site"), queryset=Site.objects.filter(is_active=True),
                                  to_field_name="code", empty_label=None)
    quota_gb = forms.IntegerField(label=gettext_lazy("Quota (GB)"), min_value=1, max_value=1_000_000, initial=1000)


def storage_context(user) -> dict:
    """What the storage page shows of Ceph: simulated or not, mounts, S3 accounts."""
    accounts = list(S3Account.objects.filter(customer=user, state=S3Account.State.ACTIVE).select_related("site"))
    for account in accounts:
        account.endpoint = s3_endpoint(account.site)
        account.live_keys = list(account.keys.filter(revoked_at__isnull=True).order_by("created_at", "pk"))
    mounts = {(m.volume_id, m.lease_id): m for m in VolumeMount.objects.filter(volume__customer=user)}
    return {"storage_simulated": not StorageCluster.objects.exists(), "s3_accounts": accounts,
            "s3_form": S3AccountForm(), "mounts": mounts}


def _back():
    return redirect("storage_mine:index")


@customer_view("order")
@login_required
@require_POST
def volume_grow(request, volume_id: int):
    volume = get_object_or_404(NetworkVolume.objects.filter(customer=request.account, state=NetworkVolume.State.ACTIVE)
                               .select_related("site"), pk=volume_id)
    form = GrowForm(request.POST)
    if not form.is_valid():
        messages.error(request, _("Enter a whole number of TB from 2 to %(max)d.") % {"max": MAX_TB})
        return _back()
    try:
        volume = volume_grow_order(volume=volume, size_tb=form.cleaned_data["size_tb"], now=timezone.now(),
                                   actor=request.account)
    except InsufficientBalance as exc:
        messages.error(request, _("%(why)s Nothing was changed.") % {"why": exc})
    except StorageRefused as exc:
        messages.error(request, _("Refused: %(why)s") % {"why": exc})
    else:
        messages.success(request, _("Volume “%(name)s” is now %(size)d TB.") % {"name": volume.name,
                                                                              "size": volume.size_tb})
    return _back()


@customer_view("order")
@login_required
@require_POST
def s3_open(request):
    form = S3AccountForm(request.POST)
    if not form.is_valid():
        messages.error(request, _("Choose a site and a quota from 1 to 1,000,000 GB."))
        return _back()
    try:
        account = s3_account_open(customer=request.account, site=form.cleaned_data["site"],
                                  quota_gb=form.cleaned_data["quota_gb"], now=timezone.now())
    except StorageRefused as exc:
        messages.error(request, _("Refused: %(why)s") % {"why": exc})
        return _back()
    messages.success(request, _("Object storage at %(site)s: quota %(gb)d GB.") % {"site": account.site.code,
                                                                                   "gb": account.quota_gb})
    return _back()


def _show_secret(request, account: S3Account, pair: tuple[str, str]):
    access, secret = pair
    return render(request, "storage/s3_key.html",
                  {"account": account, "access_key": access, "secret_key": secret,
                   "endpoint": s3_endpoint(account.site)})


@customer_view("operate")
@login_required
@require_POST
def s3_key_new(request, account_id: int):
    account = get_object_or_404(S3Account.objects.filter(customer=request.account, state=S3Account.State.ACTIVE),
                                pk=account_id)
    try:
        pair = s3_key_create(account=account, now=timezone.now())
    except StorageRefused as exc:
        messages.error(request, _("Refused: %(why)s") % {"why": exc})
        return _back()
    return _show_secret(request, account, pair)


def _key(request, key_id: int) -> S3Key:
    return get_object_or_404(S3Key.objects.filter(account__customer=request.account, revoked_at__isnull=True)
                             .select_related("account__site"), pk=key_id)


@customer_view("operate")
@login_required
@require_POST
def s3_key_rotate_view(request, key_id: int):
    key = _key(request, key_id)
    try:
        pair = s3_key_rotate(key=key, now=timezone.now(), actor=request.account)
    except StorageRefused as exc:
        messages.error(request, _("Refused: %(why)s") % {"why": exc})
        return _back()
    return _show_secret(request, key.account, pair)


@customer_view("operate")
@login_required
@require_POST
def s3_key_revoke_view(request, key_id: int):
    key = _key(request, key_id)
    try:
        s3_key_revoke(key=key, now=timezone.now(), actor=request.account)
    except StorageRefused as exc:
        messages.error(request, _("Refused: %(why)s") % {"why": exc})
    else:
        messages.success(request, _("Key %(key)s revoked: it no longer works.") % {"key": key.access_key})
    return _back()
