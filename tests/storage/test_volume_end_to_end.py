"""End to end on real parts: the storefront (live server, NodeAgentDriver), the real
`gpu-node-agent` process(es) on a private dockerd, the real Ceph test cluster. A customer
orders a network volume and attaches it to two leases; the agent mounts it with ceph-fuse
and the node's own key into both instances at /volumes/data; a file written by ssh in one
is read by ssh in the other; the quota stops a write with "Disk quota exceeded"; another
node's key cannot read it; with one OSD stopped the data is still there; detached, the
node's key loses the subvolume and the instance no longer sees it; the volume survives."""
import subprocess
import time

import pytest
from django.utils import timezone

from tests.nodeagent.agent_process import (
    agent_cli,
    agent_env,
    start_agent,
    stop_agent,
    wait_for,
    write_config,
)
from tests.nodeagent.conftest import ssh_run
from tests.nodeagent.outage_proxy import OutageProxy
from tests.nodeagent.storefront_side import shared_db
from tests.tools import require_tool

IMAGE = "pytorch-2.5-cuda-12.4"
# The test dockerd's mount namespace is a slave of the host's and the agent's state is below
# a shared mount (tests/nodeagent/conftest.py `node_tmp_root`): the ceph-fuse mounts the
# agent makes on the host reach dockerd, and the `rslave` bind of /volumes finds its source
# on a slave mount (dockerd refuses it on a private one: "not a shared or slave mount").
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def storefront(live_server, settings, catalog):
    settings.HOST_AGENT = "fleet.driver.NodeAgentDriver"
    settings.NODE_POLL_SECONDS = 1
    proxy = OutageProxy(live_server.thread.host, live_server.thread.port)
    proxy.up()
    yield proxy
    proxy.down()


def _mounts_under(root) -> list[str]:
    return [line.split()[1] for line in open("/proc/mounts").read().splitlines()
            if line.split()[1].startswith(str(root))]


def _unmount_all(root) -> None:
    for mountpoint in sorted(_mounts_under(root), reverse=True):
        subprocess.run(["umount", "-l", mountpoint], capture_output=True)


def _mounted(volume_id, lease_id):
    from storage.models import VolumeMount

    row = shared_db(VolumeMount.objects.filter(volume_id=volume_id, lease_id=lease_id).first)
    return row if row and row.mounted else None


def test_volume_mounted_shared_quota_scoped_survives_osd_loss_and_detach(
        storefront, site_cluster, ceph_cluster, customer, operator, dockerd, instance_image, netns,
        nvml_stub, ssh_key, tmp_path):
    require_tool("ssh", "openssh-client")
    require_tool("ceph-fuse", "scripts/install-ceph.sh")
    from billing.services import balance_top_up, checkout_place_order
    from fleet.services import enrolment_code_create
    from inventory.models import Node, Offer, Site, SlotAllocation
    from rental.models import Image, LeaseState, NetworkVolume
    from rental.storage import volume_attach, volume_detach
    from storage.charges import volume_order
    from storage.volumes import ceph_for, node_access_sync, volume_attachments_changed

    key_path, public_key = ssh_key
    site = Site.objects.get(code="DFW-1")
    balance_top_up(customer=customer, amount_cents=500_000, now=timezone.now())
    offer = Offer.objects.get(slug="rtx-3090")
    leases = []
    for _ in range(2):
        lease, _invoice = checkout_place_order(
            customer=customer, offer=offer, site=site, term="week", image=Image.objects.get(slug=IMAGE),
            ssh_public_key=public_key, pay_from_balance=True, now=timezone.now())
        leases.append(lease)
    nodes = {SlotAllocation.objects.filter(lease_id=le.pk, released_at__isnull=True).first().slot.node
             for le in leases}

    agents, logs, states = [], [], []
    try:
        for i, node in enumerate(sorted(nodes, key=lambda n: n.pk)):
            state = tmp_path / f"agent-{i}"
            states.append(state)
            config = write_config(tmp_path / f"config-{i}.toml", state_dir=state, dockerd=dockerd,
                                  image_ref=instance_image, public_host=netns.node_ip, gpu_count=node.gpu_count,
                                  image_slugs=(IMAGE,), port_range=(22500 + 50 * i, 22549 + 50 * i))
            config.write_text('volume_client = "fuse"\n' + config.read_text())   # top level, before [disks]
            env = agent_env(nvml_stub, gpu_count=node.gpu_count)
            code = shared_db(enrolment_code_create, node=node, actor=operator, now=timezone.now())
            enrolled = agent_cli(config, "enrol", "--url", storefront.url, "--code", code, env=env)
            assert enrolled.returncode == 0, enrolled.stderr
            logs.append(tmp_path / f"agent-{i}.log")
            agents.append(start_agent(config, env, logs[-1]))
        log = logs[0]
        for lease in leases:
            wait_for(lambda lease=lease: shared_db(type(lease).objects.get, pk=lease.pk).state == LeaseState.ACTIVE,
                     timeout=180, what=f"lease {lease.pk} active", log_path=log)
        leases = [shared_db(type(le).objects.get, pk=le.pk) for le in leases]

        # The volume: a subvolume on the cluster, then attached to both leases.
        ordered_at = time.monotonic()
        volume = shared_db(volume_order, customer=customer, site=site, name="data", size_tb=1, now=timezone.now())
        for lease in leases:
            shared_db(volume_attach, volume=volume, lease=lease, now=timezone.now(), actor=customer)
        shared_db(volume_attachments_changed, volume=volume, now=timezone.now())
        first = leases[0]
        wait_for(lambda: _mounted(volume.pk, first.pk), timeout=120, what="volume mounted", log_path=log)
        create_to_mounted = time.monotonic() - ordered_at
        print(f"\nnetwork volume: ordered to mounted in the instance in {create_to_mounted:.1f} s")
        for lease in leases:
            wait_for(lambda lease=lease: _mounted(volume.pk, lease.pk), timeout=120,
                     what=f"volume mounted for lease {lease.pk}", log_path=log)

        wrote = ssh_run(netns, key_path, leases[0].ssh_port, "echo shared-checkpoint > /volumes/data/hello && sync")
        assert wrote.returncode == 0, wrote.stderr
        read = ssh_run(netns, key_path, leases[1].ssh_port, "cat /volumes/data/hello")
        assert read.returncode == 0 and read.stdout == "shared-checkpoint\n", read.stderr

        # The quota (1 "TB" = 8 MiB here) stops a write inside the instance.
        over = ssh_run(netns, key_path, leases[0].ssh_port,
                       "dd if=/dev/zero of=/volumes/data/big bs=1M count=64 conv=fsync 2>&1; "
                       "sleep 3; dd if=/dev/zero of=/volumes/data/big2 bs=1M count=16 conv=fsync 2>&1")
        assert over.returncode != 0 and "Disk quota exceeded" in over.stdout, over.stdout + over.stderr
        assert ssh_run(netns, key_path, leases[0].ssh_port, "rm -f /volumes/data/big /volumes/data/big2").returncode == 0

        # Another node's key (no attachment there) cannot mount or read the subvolume.
        store = volume.store
        other = Node.objects.filter(site=site).exclude(pk__in=[n.pk for n in nodes]).first()
        assert node_access_sync(node=other, now=timezone.now())
        other_key = other.storage_key
        other_key.refresh_from_db()
        conf = tmp_path / "other.conf"
        keyring = tmp_path / "other.keyring"
        conf.write_text(f"[global]\nmon host = {ceph_cluster.mon_host}\nlog file = /dev/null\n")
        keyring.write_text(f"[client.{other_key.auth_id}]\n\tkey = {other_key.key}\n")
        mnt = tmp_path / "other-mnt"
        mnt.mkdir()
        try:
            foreign = subprocess.run(["ceph-fuse", "-c", str(conf), "-k", str(keyring), "--id", other_key.auth_id,
                                      "-r", store.path, str(mnt)], capture_output=True, text=True, timeout=60)
            assert foreign.returncode != 0 or not (mnt / "hello").exists(), foreign.stderr
        finally:
            _unmount_all(mnt)

        # One OSD down: the data is still readable (and writable: size 3, min_size 2).
        ceph_cluster.osd_stop(0)
        try:
            still = ssh_run(netns, key_path, leases[1].ssh_port, "cat /volumes/data/hello && echo more > /volumes/data/b")
            assert still.returncode == 0 and still.stdout.startswith("shared-checkpoint"), still.stderr
        finally:
            ceph_cluster.osd_start(0)

        # Detached from both: the node's key loses the subvolume, the instance no longer sees it.
        for lease in leases:
            shared_db(volume_detach, volume=volume, lease_id=lease.pk, now=timezone.now(), actor=customer)
        shared_db(volume_attachments_changed, volume=volume, now=timezone.now())
        for node in nodes:
            assert store.path not in ceph_for(site_cluster).auth_caps(f"storefront-node-{node.pk}").get("mds", "")
        wait_for(lambda: ssh_run(netns, key_path, leases[0].ssh_port, "test -e /volumes/data/hello",
                                 attempts=1).returncode != 0, timeout=60, what="volume gone from the instance",
                 log_path=log)
        # The volume survives: still active, its data in the cluster.
        assert NetworkVolume.objects.get(pk=volume.pk).state == NetworkVolume.State.ACTIVE
        assert ceph_for(site_cluster).subvolume_info(store.subvolume) is not None
    finally:
        for agent in agents:
            stop_agent(agent)
        for state in states:
            _unmount_all(state)
