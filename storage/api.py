"""Storage in the JSON API: the same actions as My storage (storage.pages and
.views) with the same services, rules and messages underneath: order, grow, attach,
detach and delete a network volume; take, restore and delete a snapshot; open object
storage and make, rotate and revoke its keys. Plumbing from rental.api."""
from django.http import Http404, JsonResponse
from django.utils import timezone
from django.utils.translation import gettext as _

from billing.ledger import InsufficientBalance
from inventory.models import Site
from rental.api import (
    ApiError,
    api_endpoint,
    field_errors,
    iso,
    json_body,
    snapshot_json,
    snapshots_list,
    volume_json,
    volumes_list,
)
from rental.models import Lease, NetworkVolume, Snapshot
from rental.storage import StorageRefused, storage_delete, volume_attach, volume_detach

from .charges import snapshot_order, volume_grow_order, volume_order
from .models import S3Account, S3Key
from .objects import s3_account_open, s3_endpoint, s3_key_create, s3_key_revoke, s3_key_rotate
from .pages import MAX_TB, SNAPSHOTTABLE, volume_attach_refusal
from .volumes import volume_attachments_changed, volume_store_purge_start

ORDERS_STORAGE = {"GET": "read", "POST": "pay"}  # ordering storage pays from the balance at once


def _int_field(data: dict, name: str, *, low: int = 1, high: int = MAX_TB) -> int:
    value = data.get(name)
    if type(value) is not int or not low <= value <= high:
        raise field_errors({name: [_("Give a whole number from %(low)d to %(high)d.") % {"low": low, "high": high}]})
    return value


def _lease(request, data: dict, field: str = "lease") -> Lease:
    lease_id = data.get(field)
    if type(lease_id) is not int:
        raise field_errors({field: [_("Give the id of one of your leases.")]})
    lease = Lease.objects.select_related("site", "offer__gpu_model").filter(pk=lease_id,
                                                                            customer=request.api_user).first()
    if lease is None:
        raise Http404
    return lease


def _volume(request, volume_id: int) -> NetworkVolume:
    volume = (NetworkVolume.objects.filter(customer=request.api_user).exclude(state=NetworkVolume.State.DELETED)
              .select_related("site").prefetch_related("attachments").filter(pk=volume_id).first())
    if volume is None:
        raise Http404
    return volume


def _snapshot(request, snapshot_id: int) -> Snapshot:
    snap = (Snapshot.objects.filter(customer=request.api_user).exclude(state=Snapshot.State.DELETED)
            .select_related("site").filter(pk=snapshot_id).first())
    if snap is None:
        raise Http404
    return snap


def _refused(exc: Exception) -> ApiError:
    if isinstance(exc, InsufficientBalance):
        return ApiError(402, "insufficient_balance", f"{exc} " + _("Nothing was ordered."))
    return ApiError(409, "refused", _("Refused: %(why)s") % {"why": exc})


def _fresh_volume(volume: NetworkVolume) -> dict:
    return volume_json(NetworkVolume.objects.select_related("site").prefetch_related("attachments")
                       .get(pk=volume.pk))


# --- network volumes ----------------------------------------------------------------------

@api_endpoint("GET", "POST", scope=ORDERS_STORAGE, right={"GET": "view", "POST": "order"})
def volumes(request):
    """GET: your volumes. POST {"site", "size_tb", "name"}: order one, its first 30 days paid
    from the balance."""
    if request.method == "GET":
        return volumes_list(request)
    data = json_body(request)
    site = Site.objects.filter(is_active=True, code=str(data.get("site") or "").upper()).first()
    if site is None:
        raise field_errors({"site": [_("Give one of: %(sites)s.") % {"sites": ", ".join(
            Site.objects.filter(is_active=True).values_list("code", flat=True))}]})
    size_tb = _int_field(data, "size_tb")
    name = data.get("name", "data")
    if not isinstance(name, str) or not 1 <= len(name.strip()) <= 60:
        raise field_errors({"name": [_("Give a name of 1 to 60 characters.")]})
    try:
        volume = volume_order(customer=request.api_user, site=site, name=name.strip(), size_tb=size_tb,
                              now=timezone.now())
    except (InsufficientBalance, StorageRefused) as exc:
        raise _refused(exc) from exc
    return JsonResponse(_fresh_volume(volume), status=201)


@api_endpoint("POST", scope="manage", right="operate")
def volume_attach_api(request, volume_id: int):
    """{"lease": id}: attach the volume to a running lease at its site."""
    volume = _volume(request, volume_id)
    lease = _lease(request, json_body(request))
    refusal = volume_attach_refusal(volume, lease)
    if refusal:
        raise ApiError(409, "refused", refusal)
    try:
        volume_attach(volume=volume, lease=lease, now=timezone.now(), actor=request.api_user)
    except StorageRefused as exc:
        raise _refused(exc) from exc
    volume_attachments_changed(volume=volume, now=timezone.now())
    return JsonResponse(_fresh_volume(volume))


@api_endpoint("POST", scope="manage", right="operate")
def volume_detach_api(request, volume_id: int):
    """{"lease": id}: detach the volume from that lease."""
    volume = _volume(request, volume_id)
    lease = _lease(request, json_body(request))
    if not volume_detach(volume=volume, lease_id=lease.pk, now=timezone.now(), actor=request.api_user):
        raise ApiError(409, "not_attached", _("Volume “%(name)s” is not attached to lease #%(id)d.")
                       % {"name": volume.name, "id": lease.pk})
    volume_attachments_changed(volume=volume, now=timezone.now())
    return JsonResponse(_fresh_volume(volume))


@api_endpoint("POST", scope="pay", right="order")
def volume_grow_api(request, volume_id: int):
    """{"size_tb": n}: grow the volume; the extra TB are paid pro rata from the balance."""
    volume = _volume(request, volume_id)
    if volume.state != NetworkVolume.State.ACTIVE:  # as on My storage: only an active volume grows
        raise Http404
    size_tb = _int_field(json_body(request), "size_tb", low=2)
    try:
        volume = volume_grow_order(volume=volume, size_tb=size_tb, now=timezone.now(), actor=request.api_user)
    except (InsufficientBalance, StorageRefused) as exc:
        raise _refused(exc) from exc
    return JsonResponse(_fresh_volume(volume))


@api_endpoint("DELETE", scope="manage", right="operate")
def volume_delete_api(request, volume_id: int):
    """Delete the volume: detached from every lease, its data purged."""
    volume = _volume(request, volume_id)
    now = timezone.now()
    if storage_delete(obj=volume, now=now, actor=request.api_user, reason="deleted by the customer"):
        volume_attachments_changed(volume=volume, now=now)
        volume_store_purge_start(volume=volume, now=now)
    return JsonResponse({"deleted": volume.pk})


# --- snapshots ----------------------------------------------------------------------------

@api_endpoint("GET", "POST", scope={"GET": "read", "POST": "manage"}, right={"GET": "view", "POST": "operate"})
def snapshots(request):
    """GET: your snapshots. POST {"lease", "size_tb"}: take one of a running or suspended
    lease's disk; billed in arrears for what it stores."""
    if request.method == "GET":
        return snapshots_list(request)
    data = json_body(request)
    lease = _lease(request, data)
    size_tb = _int_field(data, "size_tb")
    if lease.state not in SNAPSHOTTABLE:
        raise ApiError(409, "refused", _("Lease #%(id)d is %(state)s: its disk cannot be snapshotted.")
                       % {"id": lease.pk, "state": lease.get_state_display()})
    try:
        snap = snapshot_order(lease=lease, size_tb=size_tb, now=timezone.now(), actor=request.api_user)
    except (InsufficientBalance, StorageRefused) as exc:
        raise _refused(exc) from exc
    return JsonResponse(snapshot_json(Snapshot.objects.select_related("site").get(pk=snap.pk)), status=201)


@api_endpoint("DELETE", scope="manage", right="operate")
def snapshot_delete_api(request, snapshot_id: int):
    snap = _snapshot(request, snapshot_id)
    storage_delete(obj=snap, now=timezone.now(), actor=request.api_user, reason="deleted by the customer")
    return JsonResponse({"deleted": snap.pk})


# --- object storage -----------------------------------------------------------------------

def _s3_json(account: S3Account) -> dict:
    return {"id": account.pk, "site": account.site.code, "quota_gb": account.quota_gb, "state": account.state,
            "endpoint": s3_endpoint(account.site), "created_at": iso(account.created_at),
            "keys": [{"id": k.pk, "access_key": k.access_key, "created_at": iso(k.created_at)}
                     for k in account.keys.filter(revoked_at__isnull=True).order_by("created_at", "pk")]}


def _secret(account: S3Account, pair: tuple[str, str], status: int = 201) -> JsonResponse:
    """A new key's secret, shown this once: rental.idempotency does not keep this answer."""
    access, secret = pair
    response = JsonResponse({"account": account.pk, "endpoint": s3_endpoint(account.site), "access_key": access,
                             "secret_key": secret}, status=status)
    response.shown_once = True
    return response


@api_endpoint("GET", "POST", scope=ORDERS_STORAGE, right={"GET": "view", "POST": "order"})
def object_storage(request):
    """GET: your object-storage accounts with their live keys. POST {"site", "quota_gb"}:
    open the site's account (or change its quota); billed per GB-month of what it stores."""
    if request.method == "GET":
        rows = S3Account.objects.filter(customer=request.api_user, state=S3Account.State.ACTIVE).select_related("site")
        return JsonResponse({"accounts": [_s3_json(a) for a in rows]})
    data = json_body(request)
    site = Site.objects.filter(is_active=True, code=str(data.get("site") or "").upper()).first()
    if site is None:
        raise field_errors({"site": [_("Give one of: %(sites)s.") % {"sites": ", ".join(
            Site.objects.filter(is_active=True).values_list("code", flat=True))}]})
    quota_gb = _int_field(data, "quota_gb", high=1_000_000)
    try:
        account = s3_account_open(customer=request.api_user, site=site, quota_gb=quota_gb, now=timezone.now())
    except StorageRefused as exc:
        raise _refused(exc) from exc
    return JsonResponse(_s3_json(account), status=201)


@api_endpoint("POST", scope="manage", right="operate")
def s3_key_new_api(request, account_id: int):
    account = S3Account.objects.filter(customer=request.api_user, state=S3Account.State.ACTIVE,
                                       pk=account_id).select_related("site").first()
    if account is None:
        raise Http404
    try:
        return _secret(account, s3_key_create(account=account, now=timezone.now()))
    except StorageRefused as exc:
        raise _refused(exc) from exc


def _s3_key(request, key_id: int) -> S3Key:
    key = (S3Key.objects.filter(account__customer=request.api_user, revoked_at__isnull=True, pk=key_id)
           .select_related("account__site").first())
    if key is None:
        raise Http404
    return key


@api_endpoint("POST", scope="manage", right="operate")
def s3_key_rotate_api(request, key_id: int):
    """A new key first, then this one revoked; the new secret is in this answer only."""
    key = _s3_key(request, key_id)
    try:
        return _secret(key.account, s3_key_rotate(key=key, now=timezone.now(), actor=request.api_user))
    except StorageRefused as exc:
        raise _refused(exc) from exc


@api_endpoint("DELETE", scope="manage", right="operate")
def s3_key_revoke_api(request, key_id: int):
    key = _s3_key(request, key_id)
    try:
        s3_key_revoke(key=key, now=timezone.now(), actor=request.api_user)
    except StorageRefused as exc:
        raise _refused(exc) from exc
    return JsonResponse({"revoked": key.pk, "access_key": key.access_key})
