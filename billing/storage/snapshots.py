"""Where a snapshot lives (issue 26): an RGW user and bucket of its own at the lease's
site, with a quota of the snapshot's size, and a restic password generated here. The
node gets the S3 key and the password in its desired state, only for the snapshot's op;
the storefront keeps both sealed (rental.sealing) to restore later. Destroying the key
purges the RGW user with its objects, then forgets the password (rental.storage)."""
import secrets

from django.conf import settings
from django.utils.translation import gettext as _

from inventory.models import Site

from .ceph import CephError, CephUnavailable
from .volumes import StorageUnavailable, bytes_per_tb, ceph_for, cluster_of


def _ceph(site: Site):
    """The site's cluster with an RGW; None: storage is simulated here (demo, tests)."""
    cluster = cluster_of(site)
    if cluster is None and settings.STORAGE_SIMULATED:
        return None, ""
    if cluster is None or not cluster.rgw_endpoint:
        raise StorageUnavailable(_("Snapshots are not available at %(site)s.") % {"site": site.code})
    return ceph_for(cluster), cluster.rgw_endpoint


def snapshot_repository_open(*, site: Site, snapshot_id: int, size_tb: int) -> dict | None:
    """An RGW user, key and bucket name for the snapshot, and its restic password. None
    when the site's storage is simulated."""
    ceph, endpoint = _ceph(site)
    if ceph is None:
        return None
    uid = f"snap-{snapshot_id}-{secrets.token_hex(4)}"
    try:
        ceph.s3_user_ensure(uid, display_name=f"snapshot {snapshot_id}", max_bytes=size_tb * bytes_per_tb())
        access, secret = ceph.s3_key_create(uid)
    except (CephError, CephUnavailable) as exc:
        raise StorageUnavailable(_("The storage at %(site)s is not answering right now; nothing was taken or "
                                   "charged. Please try again later.") % {"site": site.code}) from exc
    return {"rgw_uid": uid, "repository": f"s3:{endpoint.rstrip('/')}/{uid}", "access_key": access,
            "secret_key": secret, "password": secrets.token_urlsafe(32)}


def snapshot_objects_purge(*, site: Site, rgw_uid: str) -> bool:
    """Remove the snapshot's RGW user with every object it stored; False: simulated."""
    ceph, _endpoint = _ceph(site)
    if ceph is None or not rgw_uid:
        return False
    try:
        ceph.s3_user_remove(rgw_uid)
    except (CephError, CephUnavailable) as exc:
        raise StorageUnavailable(_("The storage at %(site)s is not answering right now; the snapshot was not "
                                   "deleted. Please try again later.") % {"site": site.code}) from exc
    return True
