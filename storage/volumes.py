"""Network volumes on the site's Ceph: a CephFS subvolume per volume, created before the
customer is charged (what is sold is what exists), grown when more is bought, purged only
once the volume is deleted (by the customer, or unpaid past its grace) — so a paid volume
is never lost. Nodes reach the subvolumes of their leases' attachments through their own
cephx key, whose caps are set to exactly those (and sessions on a detached volume are
evicted). Every change is a service with an audit row; Ceph steps that fail after the
database moved on (caps, purge) are retried by the storage sweep."""
import logging
import re
import secrets
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils.translation import gettext as _

from inventory.audit import audit_record
from inventory.models import Node, Site, SlotAllocation
from rental.models import LeaseState, NetworkVolume, VolumeAttachment
from rental.storage import StorageRefused

from .ceph import Ceph, CephError, CephUnavailable, ClusterConfig
from .models import NodeStorageKey, StorageCluster, VolumeMount, VolumeStore

log = logging.getLogger(__name__)
RUNNING = (LeaseState.PROVISIONING, LeaseState.ACTIVE, LeaseState.SUSPENDED)
HEALTH_FRESH = timedelta(seconds=60)
STORAGE_TERM = timedelta(days=30)  # a volume's or snapshot's paid term (storage.charges)
STORAGE_GRACE = timedelta(days=7)  # lapsed unpaid this long: deleted


class StorageUnavailable(StorageRefused):
    """The site's storage cannot take this now (down, full, not configured); nothing was
    created or charged. The message is for the customer; the operator gets an alert."""


def bytes_per_tb() -> int:
    return settings.STORAGE_QUOTA_BYTES_PER_TB


def ceph_for(cluster: StorageCluster) -> Ceph:
    return Ceph(ClusterConfig(mon_host=cluster.mon_host, client_name=cluster.client_name,
                              client_key=cluster.secret(), fs_name=cluster.fs_name,
                              subvolume_group=cluster.subvolume_group, rgw_endpoint=cluster.rgw_endpoint),
                timeout=settings.STORAGE_CEPH_TIMEOUT_SECONDS)


def cluster_of(site: Site) -> StorageCluster | None:
    return StorageCluster.objects.filter(site=site).first()


# --- the cluster's state (dashboard, alerts, what may be sold) -------------------------------

def cluster_check(*, cluster: StorageCluster, now: datetime) -> StorageCluster:
    """Ask the cluster for its health, its volume pools' replica count and whether it is
    full; record it with an alert the ops dashboard shows."""
    ceph = ceph_for(cluster)
    try:
        health = ceph.health()
        pools = set(ceph.data_pools())
        sizes = [p.size for p in health.pools if p.name in pools]
        values = {"health": health.status, "full": health.full, "min_pool_size": min(sizes) if sizes else None}
        alerts = []
        if values["min_pool_size"] is not None and values["min_pool_size"] < 3:
            alerts.append(f"volume pools keep {values['min_pool_size']} replica(s), below 3: "
                          "network volumes are not sold as three replicas")
        if health.full:
            alerts.append("the cluster is full: no new volume can be created")
        if health.status == "HEALTH_ERR":
            alerts.append("HEALTH_ERR: " + ", ".join(health.checks))
        values["alert"] = "; ".join(alerts)[:300]
    except (CephUnavailable, CephError) as exc:
        values = {"health": "unreachable", "alert": f"cluster unreachable: {exc}"[:300]}
    changed = {k: v for k, v in values.items() if getattr(cluster, k) != v}
    StorageCluster.objects.filter(pk=cluster.pk).update(checked_at=now, **values)
    if changed:
        audit_record(actor=None, action="storage_cluster_check", obj=cluster, detail=changed, at=now)
    cluster.refresh_from_db()
    return cluster


def _cluster_ready(site: Site, *, now: datetime) -> StorageCluster | None:
    """The site's cluster if volumes can be created there now; None: simulated (demo)."""
    cluster = cluster_of(site)
    if cluster is None:
        if settings.STORAGE_SIMULATED:
            return None
        raise StorageUnavailable(_("Network volumes are not available at %(site)s.") % {"site": site.code})
    if cluster.checked_at is None or now - cluster.checked_at > HEALTH_FRESH or cluster.alert:
        cluster = cluster_check(cluster=cluster, now=now)
    if cluster.health == "unreachable":
        raise StorageUnavailable(_("The storage at %(site)s is not answering right now; nothing was created or "
                                   "charged. Please try again later.") % {"site": site.code})
    if cluster.full:
        raise StorageUnavailable(_("The storage at %(site)s is full; nothing was created or charged. The "
                                   "operator has been alerted.") % {"site": site.code})
    if not cluster.three_replicas:
        raise StorageUnavailable(_("The storage at %(site)s does not keep three replicas right now, so no "
                                   "network volume is sold there.") % {"site": site.code})
    return cluster


def _unavailable(site: Site, exc: Exception) -> StorageUnavailable:
    StorageCluster.objects.filter(site=site).update(alert=f"storage command failed: {exc}"[:300])
    log.warning("storage at %s: %s", site.code, exc)
    return StorageUnavailable(_("The storage at %(site)s could not create the volume right now; nothing was "
                                "charged. Please try again later.") % {"site": site.code})


# --- volumes -----------------------------------------------------------------------------------

def volume_provision(*, customer, site: Site, name: str, size_tb: int, now: datetime, charge,
                     term: timedelta | None = None) -> NetworkVolume:
    """Create the subvolume, then (one transaction) the volume, its store row and the
    charge `charge(volume)`, paid for `term` (the storage term unless an order's add-on
    paid another). If the transaction fails the subvolume is removed again."""
    from rental.storage import volume_create

    cluster = _cluster_ready(site, now=now)
    subvolume = f"nv-{secrets.token_hex(6)}"
    quota = size_tb * bytes_per_tb()
    path = ""
    if cluster is not None:
        try:
            path = ceph_for(cluster).subvolume_create(subvolume, size_bytes=quota)
        except (CephUnavailable, CephError) as exc:
            raise _unavailable(site, exc) from exc
    try:
        with transaction.atomic():
            volume = volume_create(customer=customer, site=site, name=name, size_tb=size_tb,
                                   paid_until=now + (term or settings_term()), now=now)
            store = VolumeStore.objects.create(volume=volume, subvolume=subvolume, path=path, quota_bytes=quota,
                                               simulated=cluster is None, created_at=now)
            audit_record(actor=customer, action="volume_store_create", obj=store,
                         detail={"subvolume": subvolume, "quota_bytes": quota, "simulated": cluster is None}, at=now)
            charge(volume)
    except Exception:
        if cluster is not None:
            try:
                ceph_for(cluster).subvolume_remove(subvolume)
            except (CephUnavailable, CephError):
                log.exception("subvolume %s left behind after a failed order", subvolume)
        raise
    return volume


def settings_term() -> timedelta:
    return STORAGE_TERM


def volume_grow(*, volume: NetworkVolume, size_tb: int, now: datetime, actor=None, charge) -> NetworkVolume:
    """Raise the volume's size (and quota) to `size_tb`: Ceph first, then the charge and
    the new size in one transaction; if that fails the quota goes back."""
    if size_tb <= volume.size_tb:
        raise StorageRefused(_("A volume only grows: %(size)d TB is not more than its %(now)d TB.")
                             % {"size": size_tb, "now": volume.size_tb})
    store = VolumeStore.objects.filter(volume=volume).first()
    cluster = None if store is None or store.simulated else _cluster_ready(volume.site, now=now)
    if cluster is not None:
        try:
            ceph_for(cluster).subvolume_resize(store.subvolume, size_bytes=size_tb * bytes_per_tb())
        except (CephUnavailable, CephError) as exc:
            raise _unavailable(volume.site, exc) from exc
    old = volume.size_tb
    try:
        with transaction.atomic():
            charge(volume, size_tb)
            NetworkVolume.objects.filter(pk=volume.pk).update(size_tb=size_tb)
            if store is not None:
                VolumeStore.objects.filter(pk=store.pk).update(quota_bytes=size_tb * bytes_per_tb())
            audit_record(actor=actor, action="volume_grow", obj=volume, detail={"from_tb": old, "to_tb": size_tb},
                         at=now)
    except Exception:
        if cluster is not None:
            try:
                ceph_for(cluster).subvolume_resize(store.subvolume, size_bytes=old * bytes_per_tb())
            except (CephUnavailable, CephError):
                log.exception("volume %s: quota left at %d TB after a failed purchase", volume.pk, size_tb)
        raise
    volume.refresh_from_db()
    return volume


@transaction.atomic
def volume_store_purge_start(*, volume: NetworkVolume, now: datetime) -> bool:
    """A deleted volume's subvolume is to be purged (by the sweep, retried until done)."""
    changed = VolumeStore.objects.filter(volume=volume, state=VolumeStore.State.READY,
                                         volume__state=NetworkVolume.State.DELETED).update(
        state=VolumeStore.State.PURGING)
    if changed:
        store = VolumeStore.objects.get(volume=volume)
        audit_record(actor=None, action="volume_store_purge_start", obj=store, detail={}, at=now)
    return bool(changed)


def volume_store_purge(*, store: VolumeStore, now: datetime) -> bool:
    """Remove the subvolume and its data. Only a deleted volume's: never a paid one."""
    store = VolumeStore.objects.select_related("volume__site").get(pk=store.pk)
    if store.volume.state != NetworkVolume.State.DELETED or store.state != VolumeStore.State.PURGING:
        return False
    if not store.simulated:
        cluster = cluster_of(store.volume.site)
        try:
            if cluster is None:
                raise CephUnavailable("the site has no storage cluster configured any more")
            ceph_for(cluster).subvolume_remove(store.subvolume)
        except (CephUnavailable, CephError) as exc:
            VolumeStore.objects.filter(pk=store.pk).update(
                attempts=F("attempts") + 1, last_error=str(exc)[:500],
                next_try_at=now + timedelta(seconds=settings.STORAGE_RETRY_SECONDS))
            return False
    with transaction.atomic():
        VolumeStore.objects.filter(pk=store.pk).update(state=VolumeStore.State.PURGED, purged_at=now, last_error="",
                                                       attempts=F("attempts") + 1)
        audit_record(actor=None, action="volume_store_purged", obj=store, detail={"subvolume": store.subvolume},
                     at=now)
    return True


# --- orphans: subvolumes no live volume owns ------------------------------------------------

SUBVOLUME_PREFIX = "nv-"  # volume_provision's names; anything else in the group is left alone


def _owned_subvolumes(names: list[str]) -> set[str]:
    """Subvolumes a volume row still owns: not purged yet, or its volume not deleted (a
    paid or lapsed volume's subvolume is never an orphan, whatever its store row says)."""
    rows = VolumeStore.objects.filter(subvolume__in=names)
    return set(rows.exclude(state=VolumeStore.State.PURGED).values_list("subvolume", flat=True)) | set(
        rows.exclude(volume__state=NetworkVolume.State.DELETED).values_list("subvolume", flat=True))


def _subvolume_created_at(info: dict) -> datetime | None:
    try:  # "2026-12-01 21:30:05" (the cluster's clock, UTC)
        return datetime.fromisoformat(str(info["created_at"])).replace(tzinfo=UTC)
    except (KeyError, ValueError):
        return None


def orphan_subvolumes_purge(*, cluster: StorageCluster, now: datetime, limit: int = 50) -> list[str]:
    """Purge the subvolumes of the storefront's group that no live volume owns (a delete
    that failed half way, a volume row removed) once older than STORAGE_ORPHAN_GRACE_SECONDS,
    each with an audit row. Ceph not answering: nothing is done (next pass)."""
    ceph = ceph_for(cluster)
    grace = timedelta(seconds=settings.STORAGE_ORPHAN_GRACE_SECONDS)
    purged = []
    try:
        names = [n for n in ceph.subvolume_names() if n.startswith(SUBVOLUME_PREFIX)]
        candidates = [n for n in names if n not in _owned_subvolumes(names)][:limit]
        for name in candidates:
            info = ceph.subvolume_info(name)
            created = _subvolume_created_at(info) if info else None
            if created is None or now - created < grace or _owned_subvolumes([name]):
                continue
            ceph.subvolume_remove(name)
            store = VolumeStore.objects.filter(subvolume=name).first()
            audit_record(actor=None, action="volume_orphan_purged", obj=cluster,
                         detail={"subvolume": name, "created_at": created.isoformat(),
                                 "store": store.pk if store else None,
                                 "bytes_used": int(info.get("bytes_used") or 0)}, at=now)
            purged.append(name)
    except (CephUnavailable, CephError) as exc:
        log.warning("storage at %s: orphan sweep stopped: %s", cluster.site_id, exc)
    return purged


# --- node access (cephx caps = the attachments of the node's leases) --------------------------

def auth_id_for(node: Node) -> str:
    return f"storefront-node-{node.pk}"


def node_wanted_stores(node: Node) -> list[VolumeStore]:
    leases = SlotAllocation.objects.filter(slot__node=node, released_at__isnull=True).values("lease_id")
    return list(VolumeStore.objects.filter(
        volume__attachments__lease_id__in=leases, volume__attachments__detached_at__isnull=True,
        volume__state=NetworkVolume.State.ACTIVE, state=VolumeStore.State.READY, simulated=False,
    ).distinct().order_by("subvolume"))


def node_access_sync(*, node: Node, now: datetime) -> bool:
    """Set the node's key to exactly the subvolumes its leases have attached; evict its
    sessions on the ones it lost. Idempotent; on failure the key stays dirty (retried)."""
    cluster = cluster_of(node.site)
    key_row, _ = NodeStorageKey.objects.get_or_create(node=node, defaults={"auth_id": auth_id_for(node)})
    if cluster is None:
        NodeStorageKey.objects.filter(pk=key_row.pk).update(dirty=False)
        return True
    ceph = ceph_for(cluster)
    wanted = node_wanted_stores(node)
    names = [s.subvolume for s in wanted]
    try:
        key = ceph.node_access_set(key_row.auth_id, [ceph.subvolume_grant(s.subvolume) for s in wanted])
        lost = set(key_row.granted) - set(names)
        for store in VolumeStore.objects.filter(subvolume__in=lost).exclude(path=""):
            ceph.node_evict(key_row.auth_id, path=store.path)
    except (CephUnavailable, CephError) as exc:
        NodeStorageKey.objects.filter(pk=key_row.pk).update(last_error=str(exc)[:500], dirty=True)
        log.warning("node %s: storage caps not synced: %s", node.name, exc)
        return False
    with transaction.atomic():
        NodeStorageKey.objects.filter(pk=key_row.pk).update(key=key, granted=names, dirty=False, updated_at=now,
                                                            last_error="")
        if set(names) != set(key_row.granted):
            audit_record(actor=None, action="node_storage_access", obj=key_row,
                         detail={"granted": names, "revoked": sorted(set(key_row.granted) - set(names))}, at=now)
    return True


def volume_attachments_changed(*, volume: NetworkVolume, now: datetime) -> None:
    """Right after an attach, detach or delete: bring the caps of the nodes concerned (those
    running a lease the volume was ever attached to, those whose key reaches it) in line
    at once; the sweep retries what fails."""
    store = VolumeStore.objects.filter(volume=volume, simulated=False).first()
    if store is None:
        return
    leases = VolumeAttachment.objects.filter(volume=volume).values("lease_id")
    node_ids = set(SlotAllocation.objects.filter(lease_id__in=leases, released_at__isnull=True)
                   .values_list("slot__node_id", flat=True))
    node_ids |= {k.node_id for k in NodeStorageKey.objects.filter(node__site=volume.site)
                 if store.subvolume in k.granted}
    for node in Node.objects.filter(pk__in=node_ids).select_related("site"):
        node_access_sync(node=node, now=now)


def lease_volumes_released(sender, *, lease_id: int, volume_ids: list[int], now: datetime, **kwargs) -> None:
    """rental.storage.lease_volumes_released: a lease ended and let go of these volumes;
    its node's key loses them now (a failure stays dirty for the sweep)."""
    for volume in NetworkVolume.objects.filter(pk__in=volume_ids).select_related("site"):
        try:
            volume_attachments_changed(volume=volume, now=now)
        except Exception:  # noqa: BLE001 - the lease has ended whatever Ceph says; the sweep retries
            log.exception("volume %s: node access not updated after lease #%s ended", volume.pk, lease_id)


# --- what a node is told (fleet.desired) and what it reports (fleet.reports) -----------------

def _mount_name(name: str, taken: set[str]) -> str:
    base = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip(".-")[:40] or "volume"
    candidate, n = base, 2
    while candidate in taken:
        candidate, n = f"{base}-{n}", n + 1
    taken.add(candidate)
    return candidate


def desired_volumes(*, node: Node, lease_ids: list[int]) -> dict[int, list[dict]]:
    """Per lease: the volumes the node mounts at /volumes/<name> (those its key reaches)."""
    key = NodeStorageKey.objects.filter(node=node).first()
    granted = set(key.granted) if key else set()
    out: dict[int, list[dict]] = {}
    rows = (VolumeAttachment.objects.filter(lease_id__in=lease_ids, detached_at__isnull=True,
                                            volume__state=NetworkVolume.State.ACTIVE)
            .select_related("volume__store").order_by("volume_id"))
    taken: dict[int, set[str]] = {}
    for a in rows:
        store = getattr(a.volume, "store", None)
        if store is None or store.simulated or store.subvolume not in granted:
            continue
        out.setdefault(a.lease_id, []).append({
            "volume_id": a.volume_id, "name": _mount_name(a.volume.name, taken.setdefault(a.lease_id, set())),
            "path": store.path})
    return out


def desired_storage(*, node: Node) -> dict | None:
    """How the node reaches its site's CephFS (None: the site has no cluster). Sent before
    any volume is granted (key ""), so instances get their /volumes from the start and an
    attach later needs no restart."""
    cluster = cluster_of(node.site)
    if cluster is None:
        return None
    key = NodeStorageKey.objects.filter(node=node).first()
    return {"mon_host": cluster.mon_host, "client_id": key.auth_id if key else auth_id_for(node),
            "key": key.key if key else "", "fs_name": cluster.fs_name}


def mounts_record(*, node: Node, lease_id: int, items: list, now: datetime) -> None:
    """The agent's `volumes` report for one lease: mounted or the named failure."""
    for item in items[:20]:
        if not isinstance(item, dict) or type(item.get("volume_id")) is not int:
            continue
        if not VolumeAttachment.objects.filter(volume_id=item["volume_id"], lease_id=lease_id).exists():
            continue
        mounted = item.get("mounted") is True
        error = item.get("error")
        if error is not None:
            error = {"code": str(error.get("code", "volume_error"))[:40], "detail": str(error.get("detail", ""))[:500]} \
                if isinstance(error, dict) else {"code": "volume_error", "detail": ""}
        row, created = VolumeMount.objects.get_or_create(
            volume_id=item["volume_id"], lease_id=lease_id,
            defaults={"mounted": mounted, "error": error, "reported_at": now,
                      "first_mounted_at": now if mounted else None})
        if not created:
            VolumeMount.objects.filter(pk=row.pk).update(
                mounted=mounted, error=error, reported_at=now,
                first_mounted_at=row.first_mounted_at or (now if mounted else None))
