"""After an agent upgrade each running instance must still reach its GPUs
(nodeagent/gpu_attachment.py): checked once on the first start of a new version (not on a
node's first start, not on a restart of the same version), then only the leases found
detached, every round, until they reach their GPUs again. The real daemon's side is in
runtime/test_docker_runtime.py."""
from fleet.conditions import INCIDENT, rule_for
from nodeagent.gpu_attachment import AttachmentCheck, parse_probe, version_changed
from nodeagent.interfaces import GpuInfo

GPUS = [GpuInfo(index=i, uuid=f"GPU-{i}", name="H100", memory_mb=1, driver="", cuda="", temperature_c=None,
                ecc_uncorrected=0, xid_errors=(), healthy=True) for i in range(3)]


class Runtime:
    def __init__(self, access):
        self.access, self.asked = access, []

    def lease_ids(self):
        return sorted(self.access)

    def gpu_access(self, lease_id):
        self.asked.append(lease_id)
        return self.access[lease_id]


def test_only_an_upgrade_makes_the_check_due(tmp_path):
    assert version_changed(tmp_path, "0.1.0") == ""                 # first start ever
    assert not AttachmentCheck(tmp_path, "0.1.0").due               # a restart, same version
    upgraded = AttachmentCheck(tmp_path, "0.2.0")
    assert upgraded.due and upgraded.previous == "0.1.0"
    assert not AttachmentCheck(tmp_path, "0.2.0").due
    assert parse_probe("unreachable /dev/nvidia3\nseen 2\n") == (2, ["/dev/nvidia3"])


def test_a_detached_lease_marks_its_gpus_until_they_are_reached_again(tmp_path):
    (tmp_path / "agent-version").write_text("0.1.0\n")
    check = AttachmentCheck(tmp_path, "0.2.0")
    runtime = Runtime({1: {"uuids": ["GPU-0"], "seen": 2, "unreachable": []},
                       2: {"uuids": ["GPU-1", "GPU-2"], "seen": 2, "unreachable": ["/dev/nvidia1"]},
                       3: None})                                   # not running
    marked = check.apply(GPUS, runtime)
    assert runtime.asked == [1, 2, 3]
    assert marked[0] == GPUS[0] and all(not g.healthy for g in marked[1:])
    assert {c.code for g in marked[1:] for c in g.conditions} == {"gpu_detached"}
    assert rule_for("gpu_detached") == INCIDENT                      # the storefront's rule
    runtime.asked.clear()
    check.apply(GPUS, runtime)
    assert runtime.asked == [2]                                      # only the flagged one, each round
    runtime.access[2] = {"uuids": ["GPU-1", "GPU-2"], "seen": 0, "unreachable": []}
    assert not check.apply(GPUS, runtime)[1].healthy                 # no device node at all: still detached
    runtime.access[2] = {"uuids": ["GPU-1", "GPU-2"], "seen": 2, "unreachable": []}
    assert check.apply(GPUS, runtime) == GPUS and check.detached == {}
