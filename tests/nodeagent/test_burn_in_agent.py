"""Burn-in end to end (docs/adr/0013): the live storefront (NodeAgentDriver, burn-in gate on) and one real
`gpu-node-agent` process with the stub NVML library and a stub `dcgmi` on its config.
Enrolment takes every card out of stock; the agent's signed burn-in records put the
passing card back and open an incident on the failing one; an application Xid opens
nothing; a link going down (fault schedule, while the agent runs) drains the card and
shows on the operator's node page; the customer's GPU page shows the burn-in date."""
from pathlib import Path

from django.utils import timezone

from .agent_process import agent_cli, agent_env, start_agent, stop_agent, wait_for, write_config
from .storefront_side import shared_db

DCGMI = Path(__file__).parent / "dcgmi_stub" / "dcgmi"


def free_on(node):
    from inventory.selectors import nodes_with_free_counts

    return nodes_with_free_counts(pk=node.pk).get().free


def test_burn_in_gates_the_sale_and_health_rules_act(live_storefront, settings, operator, dockerd,
                                                   instance_image, nvml_stub, netns, tmp_path, client):
    from fleet.services import enrolment_code_create
    from inventory.models import BurnIn, GpuSlot, Incident, Node

    settings.BURN_IN_BEFORE_SALE = True
    node = Node.objects.filter(gpu_count=2).select_related("gpu_model").order_by("name").first()
    state = tmp_path / "agent-state"
    config = write_config(tmp_path / "config.toml", state_dir=state, dockerd=dockerd,
                          image_ref=instance_image, public_host=netns.node_ip,
                          gpu_count=node.gpu_count, port_range=(22600, 22699))
    config.write_text(_with_burn_in(config.read_text()))
    faults = tmp_path / "nvml-faults"
    faults.write_text("NVML_STUB_NVLINKS=2\n")
    calls = tmp_path / "dcgmi-calls"
    env = {**agent_env(nvml_stub, gpu_count=node.gpu_count), "NVML_STUB_FAULTS": str(faults),
           "NVML_STUB_XID": "0:13", "DCGMI_STUB_FAIL": "1", "DCGMI_STUB_LOG": str(calls)}
    code = shared_db(enrolment_code_create, node=node, actor=operator, now=timezone.now())
    assert agent_cli(config, "enrol", "--url", live_storefront.url, "--code", code, env=env).returncode == 0
    assert shared_db(free_on, node) == 0                     # nothing sold before a burn-in
    log = tmp_path / "agent.log"
    agent = start_agent(config, env, log)
    try:
        wait_for(lambda: shared_db(BurnIn.objects.filter(slot__node=node, finished_at__isnull=False).count) == 2,
                 timeout=90, what="two burn-in records accepted", log_path=log)
        good, bad = (shared_db(GpuSlot.objects.get, node=node, index=i) for i in (0, 1))
        assert not good.burn_in_due and good.burn_in_passed_at and good.in_service
        assert bad.burn_in_due and not bad.in_service
        incident = shared_db(Incident.objects.get, slot=bad, ends_at__isnull=True)
        assert incident.source == Incident.Source.BURN_IN and "GPU Memory" in incident.reason
        record = shared_db(BurnIn.objects.get, slot=good, finished_at__isnull=False).record
        assert record["tool"] == "dcgmi" and record["tool_version"] == "3.3.5" and record["gpu_index"] == 0
        # before the first sale a datacenter card (the stub's brand) gets the deep level
        assert sorted(calls.read_text().splitlines()) == ["diag -r 3 -j -i 0", "diag -r 3 -j -i 1"]
        assert {c["name"]: c["status"] for c in record["checks"]} == {
            "recovery_action": "pass", "pcie_link": "pass", "h2d_bandwidth": "pass", "memory_rows": "pass"}
        # The application Xid 13 on GPU 0 is reported and opens nothing.
        assert not shared_db(Incident.objects.filter(slot=good).exists)
        assert shared_db(free_on, node) == 1

        page = client.get(f"/gpus/{node.gpu_model.slug}/")
        assert "burn-in passed since" in page.content.decode()

        # A link goes down while the agent runs: the card is drained (not sold), and the
        # operator's node page says why.
        faults.write_text("NVML_STUB_NVLINKS=2\nNVML_STUB_NVLINK_DOWN=0\n")
        wait_for(lambda: shared_db(GpuSlot.objects.get, node=node, index=0).health_hold == "nvlink_link_down",
                 timeout=60, what="GPU 0 drained for its NVLink", log_path=log)
        assert shared_db(free_on, node) == 0
        client.force_login(operator)
        admin_page = client.get(f"/admin/inventory/node/{node.pk}/change/").content.decode()
        assert "nvlink_link_down" in admin_page
        faults.write_text("NVML_STUB_NVLINKS=2\n")
        wait_for(lambda: shared_db(GpuSlot.objects.get, node=node, index=0).health_hold == "",
                 timeout=60, what="the hold clears with the link", log_path=log)
        assert shared_db(free_on, node) == 1
    finally:
        assert stop_agent(agent) == 0


def _with_burn_in(text: str) -> str:
    return text + f'\n[burn_in]\ndcgmi = "{DCGMI}"\ntimeout_seconds = 60\n'


def test_the_boot_id_is_the_kernels_and_empty_where_it_cannot_be_read(tmp_path):
    from nodeagent.agent import boot_id

    path = tmp_path / "boot_id"
    path.write_text("0b9f6a34-8f53-4b8e-9a7c-6f2d1c0e5a11\n")
    assert boot_id(str(path)) == "0b9f6a34-8f53-4b8e-9a7c-6f2d1c0e5a11"
    assert boot_id(str(tmp_path / "missing")) == ""
    assert len(boot_id()) == 36        # this machine's kernel
