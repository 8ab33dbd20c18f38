"""A real single-host Ceph cluster for the storage tests (scripts/ceph-test-cluster.sh,
booted once per session from its cache). Missing Ceph skips locally, fails with CI=true."""
import shutil
import subprocess
import time

import pytest

from tests.tools import require, require_tool

from . import ceph_cluster as cluster_script


@pytest.fixture(scope="session")
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
        deadline = time.monotonic() + 60
        while cluster.ceph("osd", "stat")["num_up_osds"] != 3 and time.monotonic() < deadline:
            time.sleep(0.5)
    return cluster
