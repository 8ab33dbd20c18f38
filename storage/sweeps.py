"""The storage sweep (part of the lifecycle pass): check each cluster, bring node keys in
line with the attachments, take back snapshot keys whose op is over, purge deleted volumes' subvolumes (retried until done), read
object storage usage from RGW and bill it."""
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Q

from inventory.models import Node
from rental.lifecycle import Transition
from rental.models import NetworkVolume

from .ceph import CephError, CephUnavailable
from .models import NodeStorageKey, S3Account, StorageCluster, VolumeStore
from .objects import BILLING_PERIOD, s3_bill, s3_meter, s3_usage_read
from .orders import ordered_volumes_retry
from .snapshots import snapshot_node_keys_sync
from .volumes import (
    cluster_check,
    node_access_sync,
    node_wanted_stores,
    orphan_subvolumes_purge,
    volume_store_purge,
    volume_store_purge_start,
)


def sweep_ceph(now: datetime, limit: int = 200) -> list[Transition]:
    done = []
    for cluster in StorageCluster.objects.select_related("site"):
        before = cluster.alert
        cluster = cluster_check(cluster=cluster, now=now)
        if cluster.alert and cluster.alert != before:
            done.append(Transition(0, f"storage at {cluster.site.code}: {cluster.alert}"))
        if cluster.health != "unreachable":
            done += [Transition(0, f"storage at {cluster.site.code}: orphan subvolume {name} purged")
                     for name in orphan_subvolumes_purge(cluster=cluster, now=now)]
    retry_after = timedelta(seconds=settings.STORAGE_ORDERED_VOLUME_RETRY_SECONDS)
    done += [Transition(0, text) for text in ordered_volumes_retry(now=now, older_than=retry_after, limit=limit)]
    # Node caps: any key whose grants differ from its leases' attachments (attach, detach,
    # lease ended or moved, volume lapsed or deleted), or left dirty by a failed sync.
    for node in Node.objects.filter(site__storage_cluster__isnull=False).select_related("site")[:limit]:
        key = NodeStorageKey.objects.filter(node=node).first()
        wanted = sorted(s.subvolume for s in node_wanted_stores(node))
        if key is None and not wanted:
            continue
        if key is None or key.dirty or sorted(key.granted) != wanted:
            if node_access_sync(node=node, now=now):
                done.append(Transition(0, f"node {node.name}: storage access set to {len(wanted)} volume(s)"))
    # Snapshot keys handed to nodes whose op is over, or whose lease ended or moved (ADR 0010).
    done += [Transition(0, text) for text in snapshot_node_keys_sync(now=now, limit=limit)]
    for store in VolumeStore.objects.filter(state=VolumeStore.State.READY,
                                            volume__state=NetworkVolume.State.DELETED)[:limit]:
        volume_store_purge_start(volume=store.volume, now=now)
    purging = VolumeStore.objects.filter(state=VolumeStore.State.PURGING).filter(
        Q(next_try_at__isnull=True) | Q(next_try_at__lte=now))
    for store in purging[:limit]:
        if volume_store_purge(store=store, now=now):
            done.append(Transition(0, f"volume store {store.subvolume} purged"))
    for account in S3Account.objects.filter(state=S3Account.State.ACTIVE).select_related("site", "customer")[:limit]:
        done.extend(_meter_and_bill(account, now))
    return done


def _meter_and_bill(account: S3Account, now: datetime) -> list[Transition]:
    from billing.ledger import InsufficientBalance

    try:
        stored = s3_usage_read(account=account)
    except (CephUnavailable, CephError):
        return []
    s3_meter(account=account, bytes_stored=stored, now=now)
    if now - account.billed_at < BILLING_PERIOD:
        return []
    try:
        entry = s3_bill(account=account, now=now)
    except InsufficientBalance:
        return [Transition(0, f"object storage {account.uid}: usage not covered by the balance, kept accrued")]
    return [Transition(0, f"object storage {account.uid}: {-entry.amount_cents} cents billed")] if entry else []
