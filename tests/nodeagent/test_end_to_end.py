"""End to end: the storefront (live server, fleet app, NodeAgentDriver) and one real
`gpu-node-agent` process on a private dockerd. An operator enrols the node, a customer
orders and pays, the agent creates the container, the customer logs in with ssh from
another network namespace and sees the lease's GPUs; a storefront outage stops nothing;
the customer's restart/stop/start reach the container; suspension stops the instance
(ssh refused), payment resumes it with the files kept, release removes it. A GPU that
NVML reports unhealthy opens an incident."""
import json

from django.utils import timezone

from tests.tools import require_tool

from .agent_process import agent_cli, agent_env, start_agent, stop_agent, wait_for, write_config
from .conftest import ssh_run
from .storefront_side import container_started_at, container_status, lease_state, shared_db

IMAGE = "pytorch-2.5-cuda-12.4"


def test_order_pay_ssh_outage_suspend_resume_release(live_storefront, customer, operator, dockerd,
                                                     instance_image, netns, nvml_stub, ssh_key,
                                                     tmp_path):
    require_tool("ssh", "openssh-client")
    from billing.renewals import renewal_invoice_create
    from billing.services import checkout_place_order, invoice_settle_manually
    from fleet.models import InstanceReport, NodeAgent
    from fleet.services import (
        enrolment_code_create,
        instance_restart,
        instance_start,
        instance_stop,
    )
    from inventory.models import Offer, Site, SlotAllocation
    from rental.models import Image, LeaseState
    from rental.services import lease_release, lease_suspend

    key_path, public_key = ssh_key
    offer = Offer.objects.get(slug="rtx-3090")
    # The customer orders: the lease's GPUs are held on a node until payment.
    lease, invoice = checkout_place_order(
        customer=customer, offer=offer, site=Site.objects.get(code="DFW-1"), term="week",
        image=Image.objects.get(slug=IMAGE), ssh_public_key=public_key, pay_from_balance=False,
        now=timezone.now())
    allocations = SlotAllocation.objects.filter(lease_id=lease.pk, released_at__isnull=True)
    node = allocations.first().slot.node
    slots = sorted(a.slot.index for a in allocations)

    state = tmp_path / "agent-state"
    config = write_config(tmp_path / "config.toml", state_dir=state, dockerd=dockerd,
                          image_ref=instance_image, public_host=netns.node_ip,
                          gpu_count=node.gpu_count, image_slugs=(IMAGE,),
                          port_range=(22400, 22499))
    env = agent_env(nvml_stub, gpu_count=node.gpu_count)
    log = tmp_path / "agent.log"

    # Without a credential and key the agent refuses to run.
    refused = agent_cli(config, "run", env=env)
    assert refused.returncode == 2 and "refusing to run" in refused.stderr

    # The operator makes a one-time code; the agent enrols with it.
    code = shared_db(enrolment_code_create, node=node, actor=operator, now=timezone.now())
    enrolled = agent_cli(config, "enrol", "--url", live_storefront.url, "--code", code, env=env)
    assert enrolled.returncode == 0, enrolled.stderr
    assert shared_db(NodeAgent.objects.get, node=node).public_key
    again = agent_cli(config, "enrol", "--url", live_storefront.url, "--code", code, env=env)
    assert again.returncode == 4                                         # one-time

    agent = start_agent(config, env, log)
    try:
        # The customer pays; the node's agent sees the lease and brings the instance up.
        assert shared_db(invoice_settle_manually, invoice=invoice, actor=operator, note="bank transfer")
        wait_for(lambda: lease_state(lease.pk).state == LeaseState.ACTIVE, timeout=120,
                 what="lease active (signed instance_ready accepted)", log_path=log)
        shared_db(lease.refresh_from_db)
        assert lease.host == netns.node_ip and 22400 <= lease.ssh_port <= 22499
        assert container_status(dockerd, lease.pk) == "running"
        reported = shared_db(NodeAgent.objects.get, node=node)
        assert reported.gpu_library == "nvml" and len(reported.gpus) == node.gpu_count

        login = ssh_run(netns, key_path, lease.ssh_port,
                        "ls /dev/nvidia*; echo checkpoint > /workspace/model.ckpt")
        assert login.returncode == 0, login.stderr
        assert login.stdout.split() == [f"/dev/nvidia{i}" for i in slots]
        # The session's bytes left through the container's network: the node reports them.
        wait_for(lambda: shared_db(InstanceReport.objects.filter(
            lease_id=lease.pk, egress_counter__gt=0).exists), timeout=30,
            what="egress reported", log_path=log)

        # Storefront outage: the agent backs off, the paid instance keeps running.
        seen = shared_db(NodeAgent.objects.get, node=node).last_seq
        live_storefront.down()
        wait_for(lambda: "retry in" in log.read_text(), what="agent back-off", log_path=log)
        assert agent.poll() is None and container_status(dockerd, lease.pk) == "running"
        assert ssh_run(netns, key_path, lease.ssh_port, "true").returncode == 0
        live_storefront.up()
        wait_for(lambda: shared_db(NodeAgent.objects.get, node=node).last_seq > seen, timeout=120,
                 what="reports after the outage", log_path=log)

        # The customer's restart, stop and start reach the instance through the agent.
        started = container_started_at(dockerd, lease.pk)
        shared_db(instance_restart, lease_id=lease.pk, customer=customer, now=timezone.now())
        wait_for(lambda: container_started_at(dockerd, lease.pk) not in (started, None),
                 timeout=60, what="container restarted", log_path=log)
        shared_db(instance_stop, lease_id=lease.pk, customer=customer, now=timezone.now())
        wait_for(lambda: container_status(dockerd, lease.pk) == "exited", timeout=60,
                 what="container stopped by the customer", log_path=log)
        shared_db(instance_start, lease_id=lease.pk, customer=customer, now=timezone.now())
        wait_for(lambda: container_status(dockerd, lease.pk) == "running", timeout=60,
                 what="container started by the customer", log_path=log)
        kept = ssh_run(netns, key_path, lease.ssh_port, "cat /workspace/model.ckpt")
        assert kept.stdout == "checkpoint\n", kept.stderr

        # The term ends unpaid: suspended, the instance stops, ssh is refused.
        assert shared_db(lease_suspend, lease_id=lease.pk, now=timezone.now(), force=True)
        wait_for(lambda: container_status(dockerd, lease.pk) == "exited", timeout=60,
                 what="container stopped", log_path=log)
        refused = ssh_run(netns, key_path, lease.ssh_port, "true", attempts=1)
        assert refused.returncode == 255 and "refused" in refused.stderr

        # The renewal is paid: resumed, the files are still there.
        shared_db(lease.refresh_from_db)
        renewal = shared_db(renewal_invoice_create, lease=lease, now=timezone.now())
        assert shared_db(invoice_settle_manually, invoice=renewal, actor=operator, note="renewal paid")
        assert lease_state(lease.pk).state == LeaseState.ACTIVE
        wait_for(lambda: container_status(dockerd, lease.pk) == "running", timeout=60,
                 what="container resumed", log_path=log)
        resumed = ssh_run(netns, key_path, lease.ssh_port, "cat /workspace/model.ckpt")
        assert resumed.returncode == 0 and resumed.stdout == "checkpoint\n", resumed.stderr

        # The renewed term ends unpaid and the hold runs out: released, container removed.
        shared_db(lease.refresh_from_db)
        assert shared_db(lease_suspend, lease_id=lease.pk, now=lease.ends_at)
        shared_db(lease.refresh_from_db)
        assert shared_db(lease_release, lease_id=lease.pk, now=lease.hold_until)
        wait_for(lambda: container_status(dockerd, lease.pk) is None, timeout=60,
                 what="container removed", log_path=log)
        # The directory backend has no key to destroy: the storefront refuses its
        # key_destroyed record as unproven, so the disk stays until a LUKS node proves it.
        wait_for(lambda: "refused key_destroyed evidence" in log.read_text(), timeout=30,
                 what="unproven key destruction refused", log_path=log)
        assert (state / "disks" / f"lease-{lease.pk}").is_dir()
        shown = json.loads(agent_cli(config, "status", env=env).stdout)
        assert shown["node"] == node.name and shown["enrolled"] and shown["last_report_at"]
    finally:
        assert stop_agent(agent) == 0


def test_a_gpu_reported_unhealthy_by_nvml_opens_an_incident(live_storefront, operator, dockerd,
                                                           instance_image, nvml_stub, netns,
                                                           tmp_path):
    from fleet.services import enrolment_code_create
    from inventory.models import Incident, Node

    node = Node.objects.filter(gpu_count__gte=2).order_by("name").first()
    state = tmp_path / "agent-state"
    config = write_config(tmp_path / "config.toml", state_dir=state, dockerd=dockerd,
                          image_ref=instance_image, public_host=netns.node_ip,
                          gpu_count=node.gpu_count, port_range=(22500, 22599))
    env = {**agent_env(nvml_stub, gpu_count=node.gpu_count), "NVML_STUB_ECC_GPU": "1"}
    code = shared_db(enrolment_code_create, node=node, actor=operator, now=timezone.now())
    assert agent_cli(config, "enrol", "--url", live_storefront.url, "--code", code,
                     env=env).returncode == 0
    log = tmp_path / "agent.log"
    agent = start_agent(config, env, log)
    try:
        incident = wait_for(lambda: shared_db(Incident.objects.filter(
            slot__node=node, slot__index=1, ends_at__isnull=True).first), timeout=60,
            what="a health-check incident on GPU 1", log_path=log)
        assert incident.source == Incident.Source.HEALTH_CHECK
        assert "uncorrected ECC" in incident.reason
        assert not shared_db(Incident.objects.filter(slot__node=node, slot__index=0).exists)
    finally:
        assert stop_agent(agent) == 0
