"""A running instance's variables or start command changed by the storefront under the same
op_id (rental.workbench.lease_workbench_change moves no op_id; PROTOCOL.md: such a change
recreates the container, the disk kept): the agent recreates it on its next pass, once,
and a restarted agent does not do it again. Found by test_end_to_end_workbench.py."""
from .helpers import GPUS, desired


def test_a_changed_variable_under_the_same_op_recreates_the_instance_once(node_state):  # noqa: F811
    make_converger, _ = node_state
    converger = make_converger()
    item = {**desired(43, "43:running:1"), "env": {"GREETING": "hello"}}
    converger.converge([item], GPUS)
    client = converger.runtime.runtime.client
    before = client.containers.get("lease-43")
    before.exec_run(["/bin/sh", "-c", "echo kept > /workspace/file"])
    converger.runtime.calls.clear()
    converger.converge([item], GPUS)
    assert converger.runtime.calls == []                 # nothing changed: nothing done

    item["env"] = {"GREETING": "changed"}
    [report] = converger.converge([item], GPUS)
    assert report["state"] == "running" and report["error"] is None
    assert converger.runtime.calls == ["ensure_stopped", "ensure_running"]
    after = client.containers.get("lease-43")
    assert after.id != before.id                         # a new container …
    assert after.exec_run(["cat", "/workspace/file"]).output == b"kept\n"     # … on the same disk
    converger.runtime.calls.clear()
    converger.converge([item], GPUS)
    assert converger.runtime.calls == []

    item["start_command"] = "exec sleep 1000"
    converger.converge([item], GPUS)
    assert converger.runtime.calls == ["ensure_stopped", "ensure_running"]
    restarted = make_converger()                         # the journal holds the digest
    restarted.converge([item], GPUS)
    assert restarted.runtime.calls == []
    assert "changed" not in (converger.journal.path.read_text())     # a digest, not the value
