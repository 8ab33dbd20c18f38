"""The LVM carver after a node's boot: a lease's LV that exists but is not active yet
(udev's autoactivation still to come, or turned off) is activated before its device is
used, instead of passing for an unformatted disk."""
from nodeagent.disks import LvmCarver
from nodeagent.disks.carvers import SCOPE_SHARED
from nodeagent.disks.runner import Result


class ListingRunner:
    """Answers `lvs` with the given LV names and records every command."""

    def __init__(self, names):
        self.names, self.argvs = names, []

    def run(self, argv, **kwargs):
        self.argvs.append(list(argv))
        out = "".join(f"  {n}\n" for n in self.names) if argv[0] == "lvs" else ""
        return Result(list(argv), 0, out, "")


def test_an_inactive_lease_lv_is_activated(monkeypatch):
    monkeypatch.setattr("nodeagent.disks.carvers.os.path.exists", lambda path: False)
    runner = ListingRunner(["gpu-lease-7"])
    carve = LvmCarver("gpu-leases").ensure(runner, 7, 1)
    assert carve.device == "/dev/gpu-leases/gpu-lease-7" and carve.scope == SCOPE_SHARED
    assert runner.argvs[1] == ["lvchange", "--activate", "y", "gpu-leases/gpu-lease-7"]
    assert not any(a[0] == "lvcreate" for a in runner.argvs)       # never carved twice


def test_an_active_lv_is_left_alone(monkeypatch):
    monkeypatch.setattr("nodeagent.disks.carvers.os.path.exists", lambda path: True)
    runner = ListingRunner(["gpu-lease-7"])
    assert LvmCarver("gpu-leases").find(runner, 7).device == "/dev/gpu-leases/gpu-lease-7"
    assert [a[0] for a in runner.argvs] == ["lvs"]


def test_a_missing_lv_is_carved():
    runner = ListingRunner([])
    LvmCarver("gpu-leases").ensure(runner, 8, 2)
    assert runner.argvs[1][:1] == ["lvcreate"] and "gpu-lease-8" in runner.argvs[1]
