"""The real agent process (console script) against a protocol-conformant storefront
double: enrolment, refusal without credential or key, desired state -> containers,
signed reports and evidence, storefront outage, removal with key destruction and wipe."""
import os
import stat
import subprocess

import pytest

from nodeagent.netfilter import TABLE
from tests.tools import require_tool

from .agent_process import (
    IMAGE_SLUG,
    STUB_GPUS,
    agent_cli,
    agent_env,
    start_agent,
    stop_agent,
    wait_for,
    write_config,
)
from .conftest import ssh_run


@pytest.fixture
def node(tmp_path, dockerd, instance_image, netns, nvml_stub):
    state = tmp_path / "state"
    config = write_config(tmp_path / "config.toml", state_dir=state, dockerd=dockerd,
                          image_ref=instance_image, public_host=netns.node_ip)
    yield config, state, agent_env(nvml_stub)
    client = dockerd.client()
    for container in client.containers.list(all=True, filters={"label": "gpu-node-agent.lease"}):
        container.remove(force=True)


def lease(lease_id, op_id, want="running", disk="keep", keys=()):
    return {"lease_id": lease_id, "op_id": op_id, "want": want, "disk": disk, "gpus": [0, 1],
            "image": IMAGE_SLUG, "ssh_authorized_keys": list(keys), "disk_gb": 10,
            "cpus": 1, "memory_gb": 1, "shm_gb": 1}


def instance_report(node, lease_id):
    """The instance item of the node's latest report for `lease_id`."""
    for report in reversed(node.reports):
        for item in report["instances"]:
            if item["lease_id"] == lease_id:
                return item
    return None


def test_run_refuses_without_credential_or_key(node, storefront):
    config, state, env = node
    refused = agent_cli(config, "run", env=env)
    assert refused.returncode == 2 and "refusing to run" in refused.stderr
    assert "enrol" in refused.stderr

    assert agent_cli(config, "enrol", "--url", storefront.url, "--code",
                     storefront.enrolment_code("n1"), env=env).returncode == 0
    (state / "node-key.pem").unlink()
    refused = agent_cli(config, "run", env=env)
    assert refused.returncode == 2 and "no signing key" in refused.stderr
    assert agent_cli(config, "status", env=env).returncode == 2


def test_enrolment_with_a_bad_code_leaves_no_identity(node, storefront):
    config, state, env = node
    result = agent_cli(config, "enrol", "--url", storefront.url, "--code", "nope", env=env)
    assert result.returncode == 4 and "enrolment_refused" in result.stderr
    assert not (state / "node-key.pem").exists() and not (state / "enrolment.json").exists()


def test_agent_process_serves_a_lease_through_an_outage(node, storefront, netns, ssh_key,
                                                        dockerd, tmp_path):
    require_tool("ssh", "openssh-client")
    config, state, env = node
    key_path, public_key = ssh_key
    enrolled = agent_cli(config, "enrol", "--url", storefront.url, "--code",
                         storefront.enrolment_code("dfw1-test-01"), env=env)
    assert enrolled.returncode == 0, enrolled.stderr
    assert stat.S_IMODE(os.stat(state / "node-key.pem").st_mode) == 0o600
    double_node = storefront.nodes["dfw1-test-01"]
    double_node.instances = [lease(21, "21:running:1", keys=[public_key])]

    log = tmp_path / "agent.log"
    agent = start_agent(config, env, log)
    try:
        ready = wait_for(lambda: next((e for e in double_node.evidence
                                       if e["kind"] == "instance_ready"), None),
                         what="signed instance_ready evidence", log_path=log)
        assert ready["gpus"] == list(STUB_GPUS) and ready["host"] == netns.node_ip
        assert ready["node"] == "dfw1-test-01" and ready["op_id"] == "21:running:1"
        # GPUs only when they changed (and every 20th report): the first one has them.
        report = next(r for r in reversed(double_node.reports) if "gpus" in r)
        assert report["gpu_library"] == "nvml" and len(report["gpus"]) == 2
        item = wait_for(lambda: instance_report(double_node, 21), log_path=log)
        assert item["state"] == "running" and item["error"] is None
        login = ssh_run(netns, key_path, ready["ssh_port"],
                        "ls /dev/nvidia*; echo kept > /workspace/f")
        assert login.returncode == 0, login.stderr
        assert login.stdout.split() == ["/dev/nvidia0", "/dev/nvidia1"]

        # Storefront outage: the agent backs off, nothing is stopped.
        storefront.stop()
        seq_before = double_node.last_seq
        wait_for(lambda: "retry in" in log.read_text(), what="back-off", log_path=log)
        assert agent.poll() is None
        assert dockerd.client().containers.get("lease-21").status == "running"
        assert ssh_run(netns, key_path, ready["ssh_port"], "cat /workspace/f").stdout == "kept\n"
        # The packet filter flushed by hand (mid-outage) is back at the agent's next round.
        in_node = ["ip", "netns", "exec", netns.node, "nft"]
        assert subprocess.run([*in_node, "flush", "ruleset"]).returncode == 0
        wait_for(lambda: "restoring it" in log.read_text(), timeout=30,
                 what="packet filter restored", log_path=log)
        assert subprocess.run([*in_node, "list", "table", "inet", TABLE],
                              capture_output=True).returncode == 0
        storefront.start()
        wait_for(lambda: double_node.last_seq > seq_before, timeout=60,
                 what="reports after the outage", log_path=log)

        # Removal: container gone, key destroyed (honestly: nothing to destroy), disk wiped.
        double_node.instances = [lease(21, "21:absent:2", want="absent", disk="wipe")]
        wait_for(lambda: {e["kind"] for e in double_node.evidence} >= {"key_destroyed",
                                                                        "disk_wiped"},
                 what="key_destroyed and disk_wiped evidence", log_path=log)
        assert dockerd.client().containers.list(all=True, filters={"name": "lease-21"}) == []
        assert not (state / "disks" / "lease-21").exists()
        destroyed = next(e for e in double_node.evidence if e["kind"] == "key_destroyed")
        assert destroyed["method"] == "none: unencrypted directory backend"
        # both GPUs' memory zeroed by the agent's own routine (here on the stub libcuda)
        assert {uuid: (c["result"], c["verified"]) for uuid, c in destroyed["gpu_memory_cleared"].items()} == \
            {uuid: ("ok", True) for uuid in STUB_GPUS}
        assert instance_report(double_node, 21)["state"] == "absent"
    finally:
        assert stop_agent(agent) == 0
    assert double_node.evidence and all(r["seq"] for r in double_node.reports)
    assert not (state / "outbox.json").read_text().strip("[] \n")    # everything delivered
