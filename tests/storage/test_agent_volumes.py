"""The agent's volume module on its own: a node that cannot mount reports a named failure
(`volume_mount_failed`) per volume, and the converger makes it the lease's error, which the
storefront records with the mount state."""
from pathlib import Path

from nodeagent.volumes import Access, Volumes


def test_no_access_is_a_named_failure(tmp_path):
    volumes = Volumes(tmp_path / "volumes", client="fuse")
    report = volumes.sync(7, [{"volume_id": 3, "name": "data", "path": "/volumes/storefront/x/y"}], None)
    assert report == [{"volume_id": 3, "mounted": False,
                       "error": {"code": "volume_mount_failed",
                                 "detail": "data: the storefront sent no storage access for this node"}}]


def test_unreachable_cluster_is_a_named_failure(tmp_path):
    from tests.tools import require_tool

    require_tool("ceph-fuse", "scripts/install-ceph.sh")
    volumes = Volumes(tmp_path / "volumes", client="fuse")
    access = Access(mon_host="127.0.0.1:9", client_id="storefront-node-1", key="AQBbadbadbadbadbadbadbadbadbadbadbadbw==",
                    fs_name="cephfs")
    [item] = volumes.sync(7, [{"volume_id": 3, "name": "data", "path": "/volumes/storefront/x/y"}], access)
    assert item["mounted"] is False and item["error"]["code"] == "volume_mount_failed"
    assert not Path(tmp_path / "volumes" / "lease-7" / "data").is_mount()
    # Malformed items from the storefront are ignored, never mounted.
    assert volumes.sync(7, [{"volume_id": 4, "name": "../etc", "path": "/"}], access) == []
