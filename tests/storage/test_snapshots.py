"""Snapshots of a lease's disk with the real agent process, a private dockerd and the test
cluster's RGW: a customer writes a checkpoint over ssh, the agent snapshots it
with restic into its own encrypted repository (the instance paused meanwhile), a second
node's agent restores it into a new lease before the instance starts and the customer finds
the checkpoint byte for byte. An agent SIGKILLed mid-snapshot leaves no snapshot in the
repository and no evidence of one; the instance it paused runs again and the snapshot is
retried by the restarted agent."""
import json
import os
import secrets
import signal
import subprocess
import time

import pytest

from tests.nodeagent.agent_process import (
    IMAGE_SLUG,
    agent_cli,
    agent_env,
    start_agent,
    stop_agent,
    wait_for,
    write_config,
)
from tests.nodeagent.conftest import ssh_run
from tests.tools import require_tool

CHECKPOINT_MB = 256


@pytest.fixture
def rgw_user(ceph_cluster):
    """An RGW user of its own for the test's snapshot repositories; purged afterwards."""
    require_tool("restic", "scripts/install-node-tools.sh")
    uid = f"snap-test-{secrets.token_hex(4)}"
    out = _radosgw_admin(ceph_cluster, "user", "create", f"--uid={uid}", f"--display-name={uid}")
    key = json.loads(out)["keys"][0]
    yield ceph_cluster, key["access_key"], key["secret_key"]
    _radosgw_admin(ceph_cluster, "user", "rm", f"--uid={uid}", "--purge-data")


def _radosgw_admin(cluster, *args):
    return subprocess.run(["radosgw-admin", "-c", cluster.conf, "-k", cluster.keyring, *args],
                          capture_output=True, text=True, check=True, timeout=120).stdout


def repository(rgw_user, bucket):
    cluster, access, secret = rgw_user
    return {"url": f"s3:{cluster.rgw_endpoint}/{bucket}", "access_key": access, "secret_key": secret,
            "password": secrets.token_urlsafe(32)}


def restic_snapshots(repo) -> list:
    env = {"PATH": os.environ["PATH"], "HOME": "/root", "RESTIC_REPOSITORY": repo["url"],
           "RESTIC_PASSWORD": repo["password"], "AWS_ACCESS_KEY_ID": repo["access_key"],
           "AWS_SECRET_ACCESS_KEY": repo["secret_key"]}
    done = subprocess.run(["restic", "--no-cache", "--json", "snapshots"], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def lease(lease_id, op_id, keys, **extra):
    return {"lease_id": lease_id, "op_id": op_id, "want": "running", "disk": "keep", "gpus": [0],
            "image": IMAGE_SLUG, "ssh_authorized_keys": list(keys), "disk_gb": 10,
            "cpus": 1, "memory_gb": 1, "shm_gb": 1, **extra}


def latest(node, lease_id, part=None):
    for report in reversed(node.reports):
        for item in report["instances"]:
            if item["lease_id"] == lease_id:
                return item.get(part) if part else item
    return None


def evidence(node, kind, lease_id):
    return [e for e in node.evidence if e["kind"] == kind and e["lease_id"] == lease_id]


def enrol(storefront, tmp_path, name, dockerd, instance_image, netns, nvml_stub, ports):
    state = tmp_path / name
    config = write_config(tmp_path / f"{name}.toml", state_dir=state, dockerd=dockerd,
                          image_ref=instance_image, public_host=netns.node_ip, port_range=ports,
                          gpu_count=1)
    env = agent_env(nvml_stub, gpu_count=1)
    enrolled = agent_cli(config, "enrol", "--url", storefront.url, "--code", storefront.enrolment_code(name),
                         env=env)
    assert enrolled.returncode == 0, enrolled.stderr
    return config, env, storefront.nodes[name]


@pytest.fixture
def cleanup(dockerd):
    processes = []
    yield processes
    for process in processes:
        if process.poll() is None:
            stop_agent(process)
    for container in dockerd.client().containers.list(all=True, filters={"label": "gpu-node-agent.lease"}):
        container.remove(force=True)


def test_snapshot_on_one_node_restores_byte_for_byte_on_another(storefront, rgw_user, dockerd, instance_image,
                                                                netns, nvml_stub, ssh_key, tmp_path, cleanup):
    key_path, public_key = ssh_key
    config_a, env, node_a = enrol(storefront, tmp_path, "node-a", dockerd, instance_image, netns, nvml_stub,
                                  (22400, 22449))
    node_a.instances = [lease(461, "461:running:1", [public_key])]
    agent_a = start_agent(config_a, env, tmp_path / "a.log")
    cleanup.append(agent_a)
    item = wait_for(lambda: (latest(node_a, 461) or {}).get("state") == "running" and latest(node_a, 461),
                    what="lease 461 running", log_path=tmp_path / "a.log")

    # The customer writes a checkpoint over ssh.
    wrote = ssh_run(netns, key_path, item["ssh_port"],
                    f"mkdir -p /workspace/run && head -c {CHECKPOINT_MB}M /dev/urandom > /workspace/run/ckpt.pt "
                    "&& echo step-4200 > /workspace/run/STEP && sha256sum /workspace/run/ckpt.pt")
    assert wrote.returncode == 0, wrote.stderr
    digest = wrote.stdout.split()[0]

    repo = repository(rgw_user, f"snap-{secrets.token_hex(4)}")
    started = time.monotonic()
    node_a.instances = [lease(461, "461:running:1", [public_key],
                              snapshot={"op_id": "snap:9:1", "snapshot_id": 9, "repository": repo})]
    states = set()

    def snapshot_done():
        state = (latest(node_a, 461, "snapshot") or {}).get("state")
        states.add(state)
        return evidence(node_a, "snapshot_taken", 461)
    [taken] = wait_for(snapshot_done, timeout=300, what="snapshot_taken evidence", log_path=tmp_path / "a.log")
    snapshot_seconds = time.monotonic() - started
    assert "running" in states or "done" in states
    assert taken["snapshot_id"] == 9 and taken["op_id"] == "snap:9:1" and taken["consistency"] == "instance paused"
    assert taken["bytes"] >= CHECKPOINT_MB * 2**20
    assert taken["stored_bytes"] >= CHECKPOINT_MB * 2**20     # random data: deduplicated, not compressible
    assert repo["password"] not in json.dumps(taken)
    [in_repo] = restic_snapshots(repo)
    assert in_repo["id"].startswith(taken["restic_snapshot"])
    assert dockerd.client().containers.get("lease-461").status == "running"      # resumed after the copy
    for path in (tmp_path / "node-a").rglob("*"):                # the password never lands on the node
        assert not path.is_file() or repo["password"].encode() not in path.read_bytes(), path

    # A second node restores it into a new lease before that lease's instance starts.
    stop_agent(agent_a)
    config_b, env_b, node_b = enrol(storefront, tmp_path, "node-b", dockerd, instance_image, netns, nvml_stub,
                                    (22450, 22499))
    node_b.instances = [lease(462, "462:running:1", [public_key], restore={
        "snapshot_id": 9, "restic_snapshot": taken["restic_snapshot"], "repository": repo})]
    started = time.monotonic()
    agent_b = start_agent(config_b, env_b, tmp_path / "b.log")
    cleanup.append(agent_b)
    [restored] = wait_for(lambda: evidence(node_b, "snapshot_restored", 462), timeout=300,
                          what="snapshot_restored evidence", log_path=tmp_path / "b.log")
    item = wait_for(lambda: (latest(node_b, 462) or {}).get("state") == "running" and latest(node_b, 462),
                    what="lease 462 running", log_path=tmp_path / "b.log")
    restore_seconds = time.monotonic() - started
    assert restored["snapshot_id"] == 9 and restored["restic_snapshot"] == taken["restic_snapshot"]
    ready = evidence(node_b, "instance_ready", 462)
    assert ready and ready[0]["at"] >= restored["at"]            # restored before the instance started
    check = ssh_run(netns, key_path, item["ssh_port"], "sha256sum /workspace/run/ckpt.pt && cat /workspace/run/STEP")
    assert check.returncode == 0, check.stderr
    assert check.stdout.split()[0] == digest and "step-4200" in check.stdout
    print(f"\nsnapshot of {CHECKPOINT_MB} MB: {snapshot_seconds:.1f} s (paused {taken['paused_seconds']} s); "
          f"restore + start: {restore_seconds:.1f} s")


def test_an_agent_killed_mid_snapshot_leaves_no_snapshot_and_retries(storefront, rgw_user, dockerd, instance_image,
                                                                     netns, nvml_stub, ssh_key, tmp_path, cleanup):
    key_path, public_key = ssh_key
    config, env, node = enrol(storefront, tmp_path, "node-k", dockerd, instance_image, netns, nvml_stub,
                              (22500, 22549))
    node.instances = [lease(71, "71:running:1", [public_key])]
    agent = start_agent(config, env, tmp_path / "k.log")
    cleanup.append(agent)
    wait_for(lambda: (latest(node, 71) or {}).get("state") == "running", what="lease 71 running",
             log_path=tmp_path / "k.log")
    container = dockerd.client().containers.get("lease-71")
    made = container.exec_run(["sh", "-c", f"head -c {CHECKPOINT_MB}M /dev/urandom > /workspace/big.bin && "
                                           "sha256sum /workspace/big.bin"])
    assert made.exit_code == 0
    digest = made.output.decode().split()[0]

    repo = repository(rgw_user, f"snap-{secrets.token_hex(4)}")
    node.instances = [lease(71, "71:running:1", [public_key],
                            snapshot={"op_id": "snap:10:1", "snapshot_id": 10, "repository": repo})]
    wait_for(lambda: (latest(node, 71, "snapshot") or {}).get("bytes_done", 0) > 0, timeout=120,
             what="the snapshot under way", log_path=tmp_path / "k.log")
    agent.send_signal(signal.SIGKILL)
    agent.wait(30)
    time.sleep(1)                        # restic dies with the agent (PR_SET_PDEATHSIG)
    assert not evidence(node, "snapshot_taken", 71)
    assert restic_snapshots(repo) == []  # restic writes the snapshot record last: none
    container.reload()
    assert container.status == "paused"  # the agent died holding it frozen

    restarted = start_agent(config, env, tmp_path / "k2.log")
    cleanup.append(restarted)
    [taken] = wait_for(lambda: evidence(node, "snapshot_taken", 71), timeout=300, what="the retried snapshot",
                       log_path=tmp_path / "k2.log")
    container.reload()
    assert container.status == "running"
    assert taken["op_id"] == "snap:10:1" and len(restic_snapshots(repo)) == 1
    still = container.exec_run(["sha256sum", "/workspace/big.bin"])
    assert still.output.decode().split()[0] == digest


def test_a_snapshot_of_a_lease_without_a_disk_is_a_named_failure(storefront, rgw_user, dockerd, instance_image,
                                                                 netns, nvml_stub, tmp_path, cleanup):
    config, env, node = enrol(storefront, tmp_path, "node-f", dockerd, instance_image, netns, nvml_stub,
                              (22550, 22599))
    repo = repository(rgw_user, f"snap-{secrets.token_hex(4)}")
    node.instances = [{**lease(81, "81:stopped:1", []), "want": "stopped",
                       "snapshot": {"op_id": "snap:11:1", "snapshot_id": 11, "repository": repo}}]
    agent = start_agent(config, env, tmp_path / "f.log")
    cleanup.append(agent)
    failed = wait_for(lambda: (latest(node, 81, "snapshot") or {}).get("state") == "failed"
                      and latest(node, 81, "snapshot"), what="the failed snapshot", log_path=tmp_path / "f.log")
    assert failed["error"]["code"] == "snapshot_failed" and "not mounted" in failed["error"]["detail"]
    assert not evidence(node, "snapshot_taken", 81)


def test_a_failed_attempt_is_not_retried_by_the_agent_and_a_new_attempt_replaces_a_running_one(
        storefront, rgw_user, dockerd, instance_image, netns, nvml_stub, ssh_key, tmp_path, cleanup, ceph_cluster):
    """The storefront retries (a new op_id per attempt), not the agent: a failed op stays
    failed; an attempt replaced while its restic runs is cancelled (restic killed, the
    instance resumed) and only the new attempt's snapshot is taken."""
    key_path, public_key = ssh_key
    config, env, node = enrol(storefront, tmp_path, "node-c", dockerd, instance_image, netns, nvml_stub,
                              (23100, 23149))
    node.instances = [lease(91, "91:running:1", [public_key])]
    agent = start_agent(config, env, tmp_path / "c.log")
    cleanup.append(agent)
    wait_for(lambda: (latest(node, 91) or {}).get("state") == "running", what="lease 91 running",
             log_path=tmp_path / "c.log")
    container = dockerd.client().containers.get("lease-91")
    made = container.exec_run(["sh", "-c", f"head -c {2 * CHECKPOINT_MB}M /dev/urandom > /workspace/big.bin"])
    assert made.exit_code == 0

    # A repository that refuses the key: the op fails, and stays failed (no retry here).
    cluster, access, _secret = rgw_user
    refused = {"url": f"s3:{cluster.rgw_endpoint}/snap-{secrets.token_hex(4)}", "access_key": access,
               "secret_key": "not-the-secret", "password": secrets.token_urlsafe(32)}
    node.instances = [lease(91, "91:running:1", [public_key],
                            snapshot={"op_id": "snap:12:1", "snapshot_id": 12, "repository": refused})]
    failed = wait_for(lambda: (latest(node, 91, "snapshot") or {}).get("state") == "failed"
                      and latest(node, 91, "snapshot"), timeout=120, what="attempt 1 failed",
                      log_path=tmp_path / "c.log")
    assert failed["op_id"] == "snap:12:1" and failed["error"]["code"] == "snapshot_failed"
    reports_before = len(node.reports)
    wait_for(lambda: len(node.reports) >= reports_before + 3, what="three more reports", log_path=tmp_path / "c.log")
    assert all((r["instances"][0].get("snapshot") or {}).get("state") == "failed" for r in node.reports[-3:])
    assert open(tmp_path / "c.log").read().count("snapshot snap:12:1 starting") == 1

    # Attempt 2 runs; attempt 3 replaces it while it runs: attempt 2's restic is killed.
    repo = repository(rgw_user, f"snap-{secrets.token_hex(4)}")
    node.instances = [lease(91, "91:running:1", [public_key],
                            snapshot={"op_id": "snap:12:2", "snapshot_id": 12, "repository": repo})]
    wait_for(lambda: (latest(node, 91, "snapshot") or {}).get("op_id") == "snap:12:2"
             and latest(node, 91, "snapshot").get("state") == "running", timeout=120,
             what="attempt 2 running", log_path=tmp_path / "c.log")
    node.instances = [lease(91, "91:running:1", [public_key],
                            snapshot={"op_id": "snap:12:3", "snapshot_id": 12, "repository": repo})]
    [taken] = wait_for(lambda: evidence(node, "snapshot_taken", 91), timeout=300, what="attempt 3's snapshot",
                       log_path=tmp_path / "c.log")
    assert taken["op_id"] == "snap:12:3"
    log_text = open(tmp_path / "c.log").read()
    assert "snap:12:2 replaced by snap:12:3: cancelling it" in log_text
    assert "snapshot snap:12:2 failed: snapshot_failed: cancelled" in log_text or \
        "snapshot snap:12:2 failed: snapshot_failed: restic" in log_text      # killed, never done
    assert len(restic_snapshots(repo)) == 1                  # attempt 2 never wrote its snapshot record
    container.reload()
    assert container.status == "running"
