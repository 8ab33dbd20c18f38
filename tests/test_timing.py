"""tests/timing.py: the end-of-run summary of where a test run's wall time went."""
from tests.timing import RunTimes, group_of


def test_group_of_reads_xdist_suffix_and_ignores_plain_ids():
    assert group_of("tests/storage/test_snapshots.py::test_restore@ceph") == "ceph"
    assert group_of("tests/bench/test_smoke.py::test_bench_runs_anywhere[faults]@bench") == "bench"
    assert group_of("tests/test_deadlines.py::test_wait") == "(none)"
    assert group_of("tests/a@b/test_x.py::test_y") == "(none)"  # an "@" in the path is not a group
    assert group_of("tests/cli/test_config.py::test_saved[laptop@laptop-saved already]") == "(none)"
    assert group_of("tests/cli/test_config.py::test_saved[laptop@laptop-saved already]@browser") == "browser"


def test_summary_names_the_worker_that_finished_last_and_how_long_the_others_idled():
    times = RunTimes()
    times.add("gw0", "tests/a.py::t1@ceph", "setup", 1.0, at=101.0)
    times.add("gw0", "tests/a.py::t1@ceph", "call", 30.0, at=131.0)
    times.add("gw1", "tests/b.py::t2", "call", 10.0, at=111.0)
    lines = times.lines()
    assert lines[0].startswith("wall 31 s")
    gw0 = next(line for line in lines if line.startswith("  gw0"))
    gw1 = next(line for line in lines if line.startswith("  gw1"))
    assert "busy 31 s, 1 tests, done at 31 s, idle 0 s; ceph 31 s" in gw0
    assert "busy 10 s, 1 tests, done at 11 s, idle 20 s; (none) 10 s" in gw1
    files = lines[lines.index("slowest files (seconds of setup + call + teardown, top 12):") + 1:]
    assert [line.strip() for line in files] == ["31.0 s  tests/a.py", "10.0 s  tests/b.py"]
