"""A real single-host Ceph cluster for the storage tests (scripts/ceph-test-cluster.sh,
booted once from its cache for this package's tests, and stopped after them). Missing Ceph skips locally, fails with CI=true."""
import shutil
import subprocess

import pytest

from tests import deadlines
from tests.tools import require, require_tool

from . import ceph_cluster as cluster_script


# Package scope: the cluster (radosgw alone takes a fifth of a core while idle) stops once
# tests/storage is done, instead of running beside every later test of the worker. Its
# tests are one xdist group (tests/conftest.py), so they run one after another.
@pytest.fixture(scope="package")
def ceph_cluster_running(tmp_path_factory):
    for tool in ("ceph-mon", "ceph-mgr", "ceph-osd", "ceph-mds", "radosgw", "radosgw-admin", "ceph-fuse"):
        require_tool(tool, "scripts/install-ceph.sh")
    require(shutil.which("ceph") is not None, "ceph (ceph-common) is not installed")
    directory = tmp_path_factory.mktemp("ceph")
    try:
        cluster = cluster_script.start(directory)
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield cluster
    finally:
        cluster_script.stop(directory)
        subprocess.run(["rm", "-rf", "--one-file-system", str(directory)], check=False)


@pytest.fixture
def ceph_cluster(ceph_cluster_running):
    """The session's cluster with its three OSDs up (a test may have stopped one)."""
    cluster = ceph_cluster_running
    stat = cluster.ceph("osd", "stat")
    if stat["num_up_osds"] != 3:
        down = [o["osd"] for o in cluster.ceph("osd", "dump")["osds"] if not o["up"]]
        for osd in down:
            cluster.osd_start(osd)
        deadlines.wait_for(lambda: cluster.ceph("osd", "stat")["num_up_osds"] == 3, 60, "three OSDs up", every=0.5)
    return cluster


# The node agent's real parts (private dockerd in its own network namespace, the cached
# instance image, the NVML stub, a customer's ssh key), shared with tests/nodeagent.
from tests.nodeagent.conftest import (  # noqa: E402,F401
    dockerd,
    instance_image,
    netns,
    node_tmp_root,
    nvml_stub,
    ssh_key,
    storefront,
    tmp_path,
)


def admin_key(cluster) -> str:
    return (cluster.dir / "keyring").read_text().split("key = ")[1].split()[0]


@pytest.fixture
def site_cluster(db, catalog, ceph_cluster, settings):
    """DFW-1's storage is the test cluster (the storefront's client: client.admin here)."""
    from inventory.models import Site
    from storage.models import StorageCluster

    settings.STORAGE_QUOTA_BYTES_PER_TB = 8 * 2**20     # 1 "TB" = 8 MiB: a quota a test can fill
    settings.STORAGE_SIMULATED = False
    return StorageCluster.objects.create(
        site=Site.objects.get(code="DFW-1"), mon_host=ceph_cluster.mon_host, client_name="client.admin",
        client_key=admin_key(ceph_cluster), fs_name=ceph_cluster.fs, rgw_endpoint=ceph_cluster.rgw_endpoint)
