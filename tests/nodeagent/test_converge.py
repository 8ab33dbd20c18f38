"""Convergence with the real Docker runtime and the directory disk backend: the journal
keeps a restarted agent from redoing finished operations, failures are named."""
import subprocess

from nodeagent.journal import Journal

from .helpers import GPUS, desired


def test_a_restarted_agent_does_not_redo_finished_operations(node_state):
    make_converger, outbox = node_state
    first = make_converger()
    [report] = first.converge([desired(31, "31:running:1")], GPUS)
    assert report["state"] == "running" and first.runtime.calls == ["ensure_running"]
    assert [e["kind"] for e in outbox.pending()] == ["instance_ready"]

    restarted = make_converger()                     # new process: journal read from disk
    [again] = restarted.converge([desired(31, "31:running:1")], GPUS)
    assert restarted.runtime.calls == []             # nothing redone
    assert again["state"] == "running" and again["ssh_port"] == report["ssh_port"]
    assert len(outbox.pending()) == 1                # no second evidence

    restarted.converge([desired(31, "31:stopped:2", want="stopped")], GPUS)
    assert restarted.runtime.calls == ["ensure_stopped"]


def test_a_finished_operation_whose_instance_vanished_is_repaired(node_state):
    make_converger, _ = node_state
    converger = make_converger()
    converger.converge([desired(32, "32:running:1")], GPUS)
    converger.runtime.runtime.client.containers.get("lease-32").remove(force=True)
    [report] = make_converger().converge([desired(32, "32:running:1")], GPUS)
    assert report["state"] == "running"


def test_failures_are_named_and_retried(node_state):
    make_converger, outbox = node_state
    converger = make_converger()
    reports = converger.converge([desired(33, "33:running:1", image="not-configured"),
                                  desired(34, "34:running:1", gpus=(0, 7)),
                                  desired(35, "35:running:1")], GPUS)
    by_lease = {r["lease_id"]: r for r in reports}
    assert by_lease[33]["state"] == "failed"
    assert by_lease[33]["error"]["code"] == "image_missing"
    assert "not-configured" in by_lease[33]["error"]["detail"]
    assert by_lease[34]["error"]["code"] == "gpu_missing"
    assert by_lease[35]["state"] == "running" and by_lease[35]["error"] is None  # independent

    # a failed op is not journaled: the next round tries it again
    retried = make_converger().converge([desired(33, "33:running:1", image="not-configured")],
                                        GPUS)[0]
    assert retried["lease_id"] == 33 and retried["error"]["code"] == "image_missing"


def test_instances_missing_from_the_desired_state_are_left_alone(node_state):
    make_converger, _ = node_state
    converger = make_converger()
    converger.converge([desired(36, "36:running:1")], GPUS)
    reports = make_converger().converge([], GPUS)      # a confused storefront lists nothing
    assert reports == [{"lease_id": 36, "op_id": "", "state": "running",
                        "ssh_port": reports[0]["ssh_port"], "egress_bytes": reports[0][
                            "egress_bytes"], "error": None, "ports": {}}]
    assert converger.runtime.runtime.status(36).state == "running"


def test_disk_actions_need_the_instance_absent(node_state):
    make_converger, _ = node_state
    item = {**desired(37, "37:running:1"), "disk": "destroy_key"}
    [report] = make_converger().converge([item], GPUS)
    assert report["error"]["code"] == "disk_error"


def test_a_new_op_for_a_running_instance_restarts_it_keeping_files(node_state):
    make_converger, outbox = node_state
    converger = make_converger()
    converger.converge([desired(38, "38:running:1")], GPUS)
    container = converger.runtime.runtime.client.containers.get("lease-38")
    container.exec_run(["/bin/sh", "-c", "echo kept > /root/file"])
    started = container.attrs["State"]["StartedAt"]

    restarted = make_converger()
    [report] = restarted.converge([desired(38, "38:running:2")], GPUS)
    assert report["state"] == "running"
    assert restarted.runtime.calls == ["ensure_stopped", "ensure_running"]
    container.reload()
    assert container.attrs["State"]["StartedAt"] != started
    assert container.exec_run(["cat", "/root/file"]).output == b"kept\n"
    assert [e["op_id"] for e in outbox.pending()] == ["38:running:1", "38:running:2"]


def test_stopping_an_instance_that_never_ran_is_done_once(node_state):
    make_converger, _ = node_state
    converger = make_converger()
    [report] = converger.converge([desired(39, "39:stopped:1", want="stopped")], GPUS)
    assert report["state"] == "absent" and report["error"] is None
    again = make_converger()
    again.converge([desired(39, "39:stopped:1", want="stopped")], GPUS)
    assert again.runtime.calls == []


def test_a_wiped_lease_leaves_the_journal_once_no_longer_listed(node_state, tmp_path):
    make_converger, outbox = node_state
    converger = make_converger()
    converger.converge([desired(40, "40:running:1")], GPUS)
    ended = {**desired(40, "40:wipe:2", want="absent"), "disk": "wipe"}
    [report] = converger.converge([ended], GPUS)
    assert report["state"] == "absent" and report["error"] is None
    assert [e["kind"] for e in outbox.pending()] == ["instance_ready", "key_destroyed",
                                                     "disk_wiped"]
    assert not (tmp_path / "disks" / "lease-40").exists()
    assert 40 in converger.journal.leases()
    converger.converge([ended], GPUS)                     # still listed: kept, not redone
    assert len(outbox.pending()) == 3
    converger.converge([], GPUS)
    assert 40 not in Journal(tmp_path / "journal.json").leases()


def test_malformed_items_are_skipped_without_blocking_the_others(node_state):
    make_converger, _ = node_state
    reports = make_converger().converge(
        ["junk", {"op_id": "x"}, {"lease_id": 41}, {**desired(42, "42:running:1"), "cpus": "many"},
         desired(43, "43:running:1", want="sideways")], GPUS)
    by_lease = {r["lease_id"]: r for r in reports}
    assert set(by_lease) == {42, 43}
    assert by_lease[42]["error"]["code"] == "bad_desired_state"
    assert by_lease[43]["error"]["code"] == "bad_desired_state"


def port_chain(runtime, host_port) -> str:
    """The packet filter's chain for a published port, as the kernel holds it."""
    listed = subprocess.run(["nsenter", "-t", str(runtime.filter.netns_pid), "-n", "nft", "list",
                             "chain", "inet", "gpu_node_agent", f"port_{host_port}"],
                            capture_output=True, text=True, check=True).stdout
    return " ".join(listed.split())


def test_published_ports_are_reported_and_follow_the_item_without_a_new_op(node_state):
    make_converger, _ = node_state
    converger = make_converger()
    runtime = converger.runtime.runtime
    item = {**desired(39, "39:running:1"), "ports": [{"port": 8888, "allow": ["203.0.113.0/24"]}]}
    [report] = converger.converge([item], GPUS)
    assert (report["state"], report["error"], report["ports"]) == ("running", None, {"8888": 23300})
    assert "ip saddr 203.0.113.0/24 accept" in port_chain(runtime, 23300)
    container = runtime.client.containers.get("lease-39")
    container.exec_run(["/bin/sh", "-c", "echo kept > /workspace/file"])

    # only the sources change: the filter is rewritten, the instance keeps running
    converger.runtime.calls.clear()
    item["ports"] = [{"port": 8888, "allow": ["198.51.100.0/24", "::/0"]}]
    [report] = converger.converge([item], GPUS)
    assert converger.runtime.calls == [] and report["ports"] == {"8888": 23300}
    assert runtime.client.containers.get("lease-39").id == container.id
    chain = port_chain(runtime, 23300)
    assert "ip saddr 198.51.100.0/24 accept ip6 saddr ::/0 accept" in chain and "203.0.113" not in chain

    # a list that does not parse fails the lease with the reason and closes its port
    item["ports"] = [{"port": 8888, "allow": ["198.51.100.0/33"]}]
    [report] = converger.converge([item], GPUS)
    assert report["state"] == "running" and report["error"]["code"] == "bad_ports"
    assert "'198.51.100.0/33' is not an IPv4 or IPv6 network" in report["error"]["detail"]
    assert "saddr" not in port_chain(runtime, 23300) and converger.runtime.calls == []
    # ... until a good one comes
    item["ports"] = [{"port": 8888, "allow": ["::/0"]}]
    [report] = converger.converge([item], GPUS)
    assert report["error"] is None and "ip6 saddr ::/0 accept" in port_chain(runtime, 23300)

    # a port added: the container is recreated (same op), its disk and 8888's address kept
    item["ports"].append({"port": 6006, "allow": []})
    [report] = converger.converge([item], GPUS)
    assert converger.runtime.calls == ["ensure_stopped", "ensure_running"]
    assert (report["state"], report["ports"]) == ("running", {"8888": 23300, "6006": 23301})
    recreated = runtime.client.containers.get("lease-39")
    assert recreated.id != container.id
    assert recreated.exec_run(["cat", "/workspace/file"]).output == b"kept\n"
    # and gone with the lease: its host ports are free again
    item.update(want="absent", op_id="39:absent:1")
    [report] = converger.converge([item], GPUS)
    assert (report["state"], report["ports"]) == ("absent", {})
    assert runtime.published.ports_for(40, [80]) == {80: 23300}
