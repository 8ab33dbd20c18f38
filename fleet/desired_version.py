"""A node's desired-state version, so a steady poll is answered `304 Not Modified`
from Redis (one authenticated lookup, one cache round trip) instead of recomputing the
document from a dozen queries.

The version is a random token per node in the cache (plus one fleet-wide epoch for the rare
changes that reach every node: an image, an offer, a GPU model, a site). Each answered
poll stores the ETag it computed under the version it read *before* computing; a poll whose
version still matches may answer 304 from it. Every change to a row the desired document
is built from moves the version of the nodes it concerns — and nobody has to remember to do
that: `watch()` (FleetConfig.ready) hooks the ORM for every model in WATCHED — saves and
deletes through signals, `QuerySet.update` / `bulk_create` / `bulk_update` by wrapping them —
and `desired_changed()` is the one function all of them call. tests/fleet/test_desired_version.py
fails when the document starts reading a table that is not watched.

A change is bumped at once and again when its transaction commits (a poll that read the
old rows between the two stores its ETag under the first token, which the second replaces).
With the cache unavailable every poll computes the document (the content ETag still gives
a 304). What the version cannot see is handled precisely, not by recomputing every document
every few minutes (at 10,000 nodes that was half of the storefront's CPU, docs/performance.md, "Fleet scale"):
- the clock: a document that changes by time alone (a snapshot attempt not due yet) is
  stored with that moment, and not answered from the cache once it has come;
- a Redis that lost versions by coming back older (restored from disk, a replica
  promoted): an ETag stored under another Redis run id is computed again, for a report
  (its round trip says which Redis answered; an older agent's GET does not, and is left
  to the bound below);
- a bump lost while Redis kept its data (unreachable at the change and again at its
  commit): a validator older than NODE_DESIRED_REVALIDATE_SECONDS is recomputed anyway."""
import secrets
from collections.abc import Iterable
from datetime import datetime

from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from django.db.models import Q, QuerySet, signals

from . import desired_watch

EPOCH_KEY = "fleet:desired:epoch"
ALL = "all"   # a mapper's answer when a change reaches every node
#: Not a cache key: where a poll's `found` carries the run id of the Redis process that
#: answered its round trip (fleet/seq.py). A restored snapshot or a promoted replica has
#: another run id and may hold versions older than changes made since, so an ETag stored
#: under another run is computed again (once per node after such an event).
REDIS_RUN = "redis:run_id"
_changes = 0  # desired_changed() calls in this process (changes_so_far)


def version_key(node_id: int) -> str:
    return f"fleet:desired:v:{node_id}"


def _etag_key(node_id: int) -> str:
    return f"fleet:desired:etag:{node_id}"


# --- which nodes a change concerns ----------------------------------------------------------

def _nodes_of_leases(lease_ids) -> QuerySet:
    """Every node that holds or held the leases' slots: the old node lists a lease until its
    disk is wiped, the new one from its allocation on."""
    from inventory.models import SlotAllocation
    return SlotAllocation.objects.filter(lease_id__in=lease_ids).values_list("slot__node_id", flat=True)


def _snapshot_nodes(qs) -> QuerySet:
    from rental.models import Lease
    return _nodes_of_leases(Lease.objects.filter(Q(pk__in=qs.values("source_lease_id")) | Q(restore_from__in=qs))
                            .values("pk"))


def _volume_nodes(volume_ids) -> QuerySet:
    from rental.models import VolumeAttachment
    return _nodes_of_leases(VolumeAttachment.objects.filter(volume_id__in=volume_ids).values("lease_id"))


def _credential_nodes(qs) -> QuerySet:
    """A registry credential is sent to the nodes of the leases that pull with it."""
    from rental.models import Lease
    return _nodes_of_leases(Lease.objects.filter(registry_credential__in=qs.values("pk")).values("pk"))


def _cluster_nodes(qs) -> QuerySet:
    from inventory.models import Node
    return Node.objects.filter(site_id__in=qs.values("site_id")).values_list("pk", flat=True)


#: Every model the desired document (fleet/desired.py) reads, with the nodes a change to a
#: set of its rows concerns. IssuedOp is written by the document itself (derived, not read as
#: an input); the report side (InstanceReport, NodeAgent…) is not part of it.
WATCHED = {
    "rental.Lease": lambda qs: _nodes_of_leases(qs.values("pk")),
    "inventory.SlotAllocation": lambda qs: qs.values_list("slot__node_id", flat=True),
    "rental.DiskKey": lambda qs: _nodes_of_leases(qs.values("lease_id")),
    "fleet.InstanceIntent": lambda qs: _nodes_of_leases(qs.values("lease_id")),
    "rental.Snapshot": _snapshot_nodes,
    "inventory.BurnIn": lambda qs: qs.values_list("slot__node_id", flat=True),
    "inventory.GpuSlot": lambda qs: qs.values_list("node_id", flat=True),
    "inventory.Node": lambda qs: qs.values_list("pk", flat=True),
    "rental.VolumeAttachment": lambda qs: _nodes_of_leases(qs.values("lease_id")),
    "rental.NetworkVolume": lambda qs: _volume_nodes(qs.values("pk")),
    "storage.VolumeStore": lambda qs: _volume_nodes(qs.values("volume_id")),
    "storage.NodeStorageKey": lambda qs: qs.values_list("node_id", flat=True),
    "storage.StorageCluster": _cluster_nodes,
    # A node's proof that it destroyed or wiped the copy a move left there is what tells it
    # the next step (fleet.desired._copies_left_here); other evidence changes no document.
    "fleet.Evidence": lambda qs: qs.filter(kind__in=("key_destroyed", "disk_wiped")).values_list("node_id", flat=True),
    # The customer's registry login, in the desired state of the node that runs the lease.
    "rental.RegistryCredential": _credential_nodes,
    # Rare, and read by every node's document: the whole fleet's epoch moves.
    "rental.Image": lambda qs: ALL,
    "inventory.Offer": lambda qs: ALL,
    "inventory.GpuModel": lambda qs: ALL,
    "inventory.Site": lambda qs: ALL,
}
DERIVED = {"fleet.IssuedOp"}


def desired_changed(node_ids: Iterable[int] | str) -> None:
    """The one function every change to a node's desired state goes through (the ORM hooks
    below call it): new versions for these nodes (or ALL: a new fleet-wide epoch), now and
    again when the transaction commits."""
    global _changes
    ids = ALL if node_ids == ALL else sorted({n for n in node_ids if n is not None})
    if not ids:
        return
    _changes += 1
    _bump(ids)
    transaction.on_commit(lambda: _bump(ids, announce=True))


def _bump(ids, *, announce: bool = False) -> None:
    """`announce`: wake the nodes watching for a change (fleet/desired_watch.py) — only once
    the change is committed, so that what they fetch then includes it."""
    token = secrets.token_hex(6)
    if ids == ALL:
        cache.set(EPOCH_KEY, token, timeout=None)
    else:
        cache.set_many({version_key(n): token for n in ids}, timeout=None)
    if announce:
        desired_watch.announce(desired_watch.EVERY_NODE if ids == ALL else ids, token)


def _changed(model, qs) -> None:
    mapper = WATCHED.get(model._meta.label)
    if mapper is None:
        return
    nodes = mapper(qs)
    desired_changed(ALL if nodes == ALL else list(nodes))


# --- the validator a poll may answer 304 from -------------------------------------------------

def desired_stamp(node_id: int) -> tuple | None:
    """(epoch, version) as they are now, created if missing; None without a cache."""
    keys = [EPOCH_KEY, version_key(node_id)]
    found = cache.get_many(keys)
    if len(found) < 2:
        for key in keys:
            if key not in found:
                cache.add(key, secrets.token_hex(6), timeout=None)
        found = cache.get_many(keys)
        if len(found) < 2:
            return None
    return found[EPOCH_KEY], found[version_key(node_id)]


def etag_keys(node_id: int) -> tuple[str, ...]:
    """What current_etag reads: a poll reads them in the round trip that also counts it
    against the node's rate limit (fleet/views.py)."""
    return EPOCH_KEY, version_key(node_id), _etag_key(node_id)


def changes_so_far() -> int:
    """How many times desired_changed() ran in this process: a request whose own work moved
    a version (a report's evidence) reads the ETag again rather than use what it read first."""
    return _changes


def current_etag(node_id: int, now: datetime, *, found: dict | None = None) -> str | None:
    """The ETag of the node's desired state if the one stored is still current: same epoch
    and version, not past the moment its document changes by the clock alone, written under
    the run of the Redis that answered this poll (when the poll's round trip said which:
    REDIS_RUN in `found`), and younger than NODE_DESIRED_REVALIDATE_SECONDS; else None.
    `found`: the keys as the poll's round trip read them in this request."""
    keys = etag_keys(node_id)
    run = found.get(REDIS_RUN) if found is not None else None
    found = {k: found[k] for k in keys if k in found} if found is not None else cache.get_many(keys)
    stored = found.get(_etag_key(node_id))
    if not isinstance(stored, tuple) or len(stored) != 6 or len(found) < 3:
        return None                    # none, or stored by an older release: computed again
    epoch, version, etag, at, until, stored_run = stored
    if (epoch, version) != (found[EPOCH_KEY], found[version_key(node_id)]):
        return None
    if until is not None and now.timestamp() >= until:
        return None
    if run is not None and stored_run != run:
        return None
    if now.timestamp() - at > settings.NODE_DESIRED_REVALIDATE_SECONDS:
        return None
    return etag


def remember_etag(node_id: int, stamp: tuple | None, etag: str, now: datetime, *, until: datetime | None = None,
                  run: str | None = None) -> None:
    """`until`: when the document changes by the clock alone (a snapshot attempt that is not
    due yet); `run`: the Redis run id the poll's round trip reported, if it did."""
    if stamp is not None:
        cache.set(_etag_key(node_id), (*stamp, etag, now.timestamp(), until and until.timestamp(), run),
                  timeout=2 * settings.NODE_DESIRED_REVALIDATE_SECONDS)


# --- the ORM hooks -----------------------------------------------------------------------------

_watching = False


def watch() -> None:
    """Hook every write to a WATCHED model (once per process)."""
    global _watching
    if _watching:
        return
    _watching = True
    from django.apps import apps

    for label in WATCHED:
        model = apps.get_model(label)
        signals.post_save.connect(_after_save, sender=model, weak=False, dispatch_uid=f"desired-{label}")
        signals.pre_delete.connect(_before_delete, sender=model, weak=False, dispatch_uid=f"desired-del-{label}")

    original_update, original_bulk_create, original_bulk_update = (QuerySet.update, QuerySet.bulk_create,
                                                                   QuerySet.bulk_update)

    def update(self, **kwargs):
        if self.model._meta.label in WATCHED:
            rows = self._chain()
            rows.query.select_for_update = False     # read which rows, whatever the caller locks
            _changed(self.model, self.model._base_manager.filter(pk__in=list(rows.values_list("pk", flat=True))))
        return original_update(self, **kwargs)

    def bulk_create(self, objs, *args, **kwargs):
        created = original_bulk_create(self, objs, *args, **kwargs)
        if self.model._meta.label in WATCHED:
            _changed(self.model, self.model._base_manager.filter(pk__in=[o.pk for o in created if o.pk]))
        return created

    def bulk_update(self, objs, fields, *args, **kwargs):
        if self.model._meta.label in WATCHED:
            _changed(self.model, self.model._base_manager.filter(pk__in=[o.pk for o in objs if o.pk]))
        return original_bulk_update(self, objs, fields, *args, **kwargs)

    QuerySet.update, QuerySet.bulk_create, QuerySet.bulk_update = update, bulk_create, bulk_update


def _after_save(sender, instance, raw=False, **kwargs) -> None:
    if not raw:
        _changed(sender, sender._base_manager.filter(pk=instance.pk))


def _before_delete(sender, instance, **kwargs) -> None:
    _changed(sender, sender._base_manager.filter(pk=instance.pk))
