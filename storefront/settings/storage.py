"""Storage settings: each site's Ceph cluster (storage/, README
"Storage") and the snapshots of lease disks (rental.storage, nodeagent/snapshots.py). Star-
imported by storefront/settings/__init__.py, so they are Django settings like the others."""
import os

from .env import DEBUG, TESTING, env_bool

# --- Storage on each site's Ceph cluster (storage/, README "Storage") ---
# Without a configured cluster a site's storage is simulated (nothing is stored; the pages
# say so) — only for the demo and tests; in production such a site sells no storage.
STORAGE_SIMULATED = env_bool("STORAGE_SIMULATED", DEBUG or TESTING)
# Object storage, billed per GB-month in arrears (SPEC's second price list: 0.015/GB-month).
OBJECT_STORAGE_CENTS_PER_TB_MONTH = int(os.environ.get("OBJECT_STORAGE_CENTS_PER_TB_MONTH", "1500"))
# Seconds a Ceph command may take before the cluster counts as unavailable.
STORAGE_CEPH_TIMEOUT_SECONDS = int(os.environ.get("STORAGE_CEPH_TIMEOUT_SECONDS", "30"))
# A subvolume whose purge failed is retried on the next storage sweep, at most this often.
STORAGE_RETRY_SECONDS = int(os.environ.get("STORAGE_RETRY_SECONDS", "60"))
# Quota bytes per TB sold (decimal TB; an operator may add headroom). Tests shrink it.
STORAGE_QUOTA_BYTES_PER_TB = int(os.environ.get("STORAGE_QUOTA_BYTES_PER_TB", str(10 ** 12)))
# A subvolume in the storefront's group that no live volume owns (a delete that failed half
# way, a volume row removed by hand) is purged by the storage sweep once it is this old: a
# volume being ordered has its subvolume a moment before its database row commits.
STORAGE_ORPHAN_GRACE_SECONDS = int(os.environ.get("STORAGE_ORPHAN_GRACE_SECONDS", "3600"))
# An order's network volume add-on left pending (a crash between payment and Ceph) is
# retried by the storage sweep once it is this old.
STORAGE_ORDERED_VOLUME_RETRY_SECONDS = int(os.environ.get("STORAGE_ORDERED_VOLUME_RETRY_SECONDS", "120"))
# --- Snapshots of lease disks (rental.storage, nodeagent/snapshots.py) ---
# A snapshot is tried at most this many times (attempts); each failed attempt (the node
# reports the named failure, or the attempt times out) is an audit row, the last one makes
# the snapshot `failed` with its reason shown to the customer.
SNAPSHOT_ATTEMPTS = int(os.environ.get("SNAPSHOT_ATTEMPTS", "3"))
# An attempt the node has not reported progress on for this long has failed
# (`snapshot_timed_out`: the agent was killed, the node is gone, restic hangs).
SNAPSHOT_STALLED_MINUTES = int(os.environ.get("SNAPSHOT_STALLED_MINUTES", "20"))
# The next attempt is sent to the node this long after the failed one.
SNAPSHOT_RETRY_SECONDS = int(os.environ.get("SNAPSHOT_RETRY_SECONDS", "60"))
# A migration off a node that still answers first has it snapshot the disk (rental.failover);
# when that copy is not ready within this, the lease moves with its latest ready snapshot.
MIGRATION_SNAPSHOT_WAIT_MINUTES = int(os.environ.get("MIGRATION_SNAPSHOT_WAIT_MINUTES", "20"))
