"""The real agent process keeps its packet filter while the storefront is down: a
`nft flush ruleset` during an outage is undone by the filter guard's own timer
(`filter_guard_seconds`), not at the next agent round, which the back-off puts a minute
away here (up to `max_backoff_seconds`, 300 s, on a node). The restored table is the one
for the leases the agent last knew, written with nft alone."""
import re
import subprocess
import time

import pytest

from nodeagent.config import AgentConfig
from nodeagent.netfilter import TABLE
from tests import deadlines

from .agent_process import (
    IMAGE_SLUG,
    agent_cli,
    agent_env,
    start_agent,
    stop_agent,
    wait_for,
    write_config,
)

POLL_SECONDS = 60          # the storefront's poll interval: the agent's back-off starts there
LEASE_ID = 23


@pytest.fixture
def node(tmp_path, dockerd, instance_image, netns, nvml_stub):
    state = tmp_path / "state"
    config = write_config(tmp_path / "config.toml", state_dir=state, dockerd=dockerd,
                          image_ref=instance_image, public_host=netns.node_ip,
                          port_range=(22300, 22399))
    yield config, agent_env(nvml_stub)
    client = dockerd.client()
    for container in client.containers.list(all=True, filters={"label": "gpu-node-agent.lease"}):
        container.remove(force=True)


def test_a_flushed_filter_is_back_within_the_guard_interval_during_an_outage(
        node, storefront, netns, dockerd, tmp_path):
    config, env = node
    code = storefront.enrolment_code("guard-test-01")
    double_node = storefront.nodes["guard-test-01"]
    double_node.poll_seconds = POLL_SECONDS
    assert agent_cli(config, "enrol", "--url", storefront.url, "--code", code,
                     env=env).returncode == 0
    double_node.instances = [{"lease_id": LEASE_ID, "op_id": f"{LEASE_ID}:running:1",
                              "want": "running", "disk": "keep", "gpus": [0], "image": IMAGE_SLUG,
                              "ssh_authorized_keys": [], "disk_gb": 10, "cpus": 1,
                              "memory_gb": 1, "shm_gb": 1}]
    log = tmp_path / "agent.log"
    agent = start_agent(config, env, log)
    try:
        wait_for(lambda: any(e["kind"] == "instance_ready" for e in double_node.evidence),
                 what="the lease's instance_ready evidence", log_path=log)
    finally:
        assert stop_agent(agent) == 0
    # The outage: the storefront is down and the agent (restarted) fails its first round
    # and backs off for most of a minute.
    storefront.stop()
    log = tmp_path / "agent-outage.log"
    agent = start_agent(config, env, log)
    try:
        backoff = int(wait_for(lambda: re.search(r"retry in (\d+)s", log.read_text()),
                               what="the agent backing off", log_path=log).group(1))
        in_node = ["ip", "netns", "exec", netns.node, "nft"]
        assert subprocess.run([*in_node, "flush", "ruleset"]).returncode == 0
        flushed = time.monotonic()

        def table_back() -> bool:
            return subprocess.run([*in_node, "list", "table", "inet", TABLE],
                                  capture_output=True).returncode == 0

        # bound on a broken agent: past the next round (without the guard it is that round)
        wait_for(table_back, timeout=POLL_SECONDS * 1.5, what="the table restored",
                 log_path=log)
        window = time.monotonic() - flushed
        interval = AgentConfig().filter_guard_seconds
        print(f"filter window after flush during outage: {window:.1f} s (guard every "
              f"{interval:g} s; the agent's next round was {backoff} s away)")
        assert window <= deadlines.scaled(3 * interval + 1)
        text = log.read_text()
        assert "restoring it" in text and text.count("retry in") == 1   # no round ran
        # the lease the agent knew is in it (its counter, its bridge), the forward drop too
        listed = subprocess.run([*in_node, "list", "table", "inet", TABLE],
                                capture_output=True, text=True).stdout
        assert f'"gl{LEASE_ID}" : "egress_{LEASE_ID}"' in listed
        assert "hook forward priority filter - 10; policy drop;" in listed
        assert dockerd.client().containers.get(f"lease-{LEASE_ID}").status == "running"
    finally:
        stopping = time.monotonic()
        code = stop_agent(agent)
    assert code == 0                                  # the guard thread stops with the agent
    assert time.monotonic() - stopping <= deadlines.scaled(10)
