"""The test cluster itself is what the storage tests rely on: three replicas on three OSDs
(failure domain osd), a CephFS with its MDS, radosgw answering S3 on loopback; and the
storefront's adapter (storage.ceph) against it, without Django."""

import boto3
import pytest
from botocore.client import Config

from storage.ceph import Ceph, CephError, CephUnavailable, ClusterConfig
from tests import deadlines

GiB = 1024 ** 3


def admin_config(cluster) -> ClusterConfig:
    key = (cluster.dir / "keyring").read_text().split("key = ")[1].split()[0]
    return ClusterConfig(mon_host=cluster.mon_host, client_name="client.admin", client_key=key,
                         fs_name=cluster.fs, rgw_endpoint=cluster.rgw_endpoint)


def test_cluster_has_three_replicas_on_three_osds(ceph_cluster):
    health = Ceph(admin_config(ceph_cluster)).health()
    assert health.status in ("HEALTH_OK", "HEALTH_WARN"), health.checks
    assert health.pools and all(p.size == 3 and p.min_size == 2 for p in health.pools), health.pools
    assert ceph_cluster.ceph("osd", "stat")["num_up_osds"] == 3
    rules = ceph_cluster.ceph("osd", "crush", "rule", "dump")
    steps = [s for r in rules for s in r["steps"] if s["op"].startswith("choose")]
    assert steps and all(s["type"] == "osd" for s in steps), steps
    assert not health.full
    print(f"\nceph test cluster: boot {ceph_cluster.boot_seconds:.1f} s, "
          f"daemons' RSS {ceph_cluster.rss_bytes() / 2**20:.0f} MiB")


def test_subvolume_create_resize_remove_idempotent(ceph_cluster):
    ceph = Ceph(admin_config(ceph_cluster))
    path = ceph.subvolume_create("t-idem", size_bytes=GiB)
    assert path.startswith("/volumes/storefront/t-idem/")
    assert ceph.subvolume_create("t-idem", size_bytes=GiB) == path   # again: same subvolume
    ceph.subvolume_resize("t-idem", size_bytes=2 * GiB)
    assert int(ceph.subvolume_info("t-idem")["bytes_quota"]) == 2 * GiB
    ceph.subvolume_remove("t-idem")
    ceph.subvolume_remove("t-idem")                                   # absent: still done
    assert ceph.subvolume_info("t-idem") is None
    assert "t-idem" not in ceph.subvolume_names()


def test_node_key_is_scoped_to_its_subvolumes(ceph_cluster):
    ceph = Ceph(admin_config(ceph_cluster))
    ceph.subvolume_create("t-a", size_bytes=GiB)
    ceph.subvolume_create("t-b", size_bytes=GiB)
    try:
        grant = ceph.subvolume_grant("t-a")
        key = ceph.node_access_set("t-node", [grant])
        assert key and ceph.node_access_set("t-node", [grant]) == key
        caps = ceph.auth_caps("t-node")
        assert f"path={grant.path}" in caps["mds"] and "t-b" not in caps["mds"], caps
        assert "namespace=fsvolumens_t-a" in caps["osd"], caps
        ceph.node_access_set("t-node", [])
        assert set(ceph.auth_caps("t-node")) == {"mon"}
        ceph.node_evict("t-node", path=grant.path)    # no session: nothing to evict, no error
    finally:
        for name in ("t-a", "t-b"):
            ceph.subvolume_remove(name)


def test_s3_user_keys_quota_and_usage(ceph_cluster):
    ceph = Ceph(admin_config(ceph_cluster))
    ceph.s3_user_ensure("t-s3", display_name="test", max_bytes=10 * 2**20)
    access, secret = ceph.s3_key_create("t-s3")
    s3 = boto3.client("s3", endpoint_url=ceph_cluster.rgw_endpoint, aws_access_key_id=access,
                      aws_secret_access_key=secret, region_name="default",
                      config=Config(signature_version="s3v4", s3={"addressing_style": "path"}))
    s3.create_bucket(Bucket="t-bucket")
    s3.put_object(Bucket="t-bucket", Key="a", Body=b"x" * 300_000)
    deadlines.wait_for(lambda: ceph.s3_bytes_stored("t-s3") >= 300_000, 60, "RGW's usage statistics", every=1)
    ceph.s3_key_remove("t-s3", access)
    with pytest.raises(Exception, match="InvalidAccessKeyId|Forbidden|403"):
        s3.list_objects_v2(Bucket="t-bucket")
    ceph.s3_user_remove("t-s3")


def test_unreachable_cluster_is_a_named_failure(ceph_cluster):
    config = admin_config(ceph_cluster)
    dead = ClusterConfig(mon_host="127.0.0.1:9", client_name=config.client_name,
                         client_key=config.client_key)
    with pytest.raises(CephUnavailable):
        Ceph(dead, timeout=3).health()
    with pytest.raises(CephError):
        Ceph(config).subvolume_resize("no-such-volume", size_bytes=GiB)
