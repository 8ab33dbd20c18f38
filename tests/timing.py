"""Where a test run's time went, per xdist worker and per xdist group: printed at the end of a
run when TEST_TIMING_SUMMARY is set (.ci/run sets it for both passes).

CI's budget is wall time, and `--dist loadgroup` puts each group (one Chromium, one set of
chain daemons, one Ceph cluster, the benchmarks) on a single worker: the pass ends when its
busiest worker does. `--durations` names slow tests but not which worker they held up; this
names the worker that finished last, what it ran, and how long the others stood idle.

tests/conftest.py imports the two hooks; under xdist they run on the controller, which is
told of every test phase (the report's `node` is the worker that ran it)."""
from __future__ import annotations

import os
import time
from collections import defaultdict
from dataclasses import dataclass, field

ENABLE = "TEST_TIMING_SUMMARY"


@dataclass
class WorkerTime:
    busy: float = 0.0                     # seconds of setup + call + teardown
    tests: int = 0
    last_done: float = 0.0                # seconds after the first report of the run
    groups: dict[str, float] = field(default_factory=lambda: defaultdict(float))


@dataclass
class RunTimes:
    started: float | None = None
    workers: dict[str, WorkerTime] = field(default_factory=lambda: defaultdict(WorkerTime))
    files: dict[str, float] = field(default_factory=lambda: defaultdict(float))

    def add(self, worker: str, nodeid: str, when: str, duration: float, at: float) -> None:
        """One phase (setup, call, teardown) of one test, reported at `at` (time.monotonic())."""
        if self.started is None:
            self.started = at - duration
        w = self.workers[worker]
        w.busy += duration
        w.tests += when == "call"
        w.last_done = max(w.last_done, at - self.started)
        w.groups[group_of(nodeid)] += duration
        self.files[nodeid.partition("::")[0]] += duration

    def lines(self, top_files: int = 12) -> list[str]:
        if not self.workers:
            return []
        end = max(w.last_done for w in self.workers.values())
        out = [f"wall {end:.0f} s; per worker: busy, tests, finished at, idle at the end; its largest groups"]
        for name in sorted(self.workers):
            w = self.workers[name]
            groups = ", ".join(f"{g} {s:.0f} s" for g, s in sorted(w.groups.items(), key=lambda kv: -kv[1])[:4])
            out.append(f"  {name}: busy {w.busy:.0f} s, {w.tests} tests, done at {w.last_done:.0f} s, "
                       f"idle {end - w.last_done:.0f} s; {groups}")
        out.append(f"slowest files (seconds of setup + call + teardown, top {top_files}):")
        for path, seconds in sorted(self.files.items(), key=lambda kv: -kv[1])[:top_files]:
            out.append(f"  {seconds:7.1f} s  {path}")
        return out


def group_of(nodeid: str) -> str:
    """The xdist group a node id names ("…@ceph"), or "(none)". xdist appends "@group" after
    any parameters, so an "@" inside a parameter ("[a@b]") is not one."""
    tail = nodeid.rpartition("::")[2].rpartition("@")
    return tail[2] if tail[1] and tail[2] and not set(tail[2]) & set("[] ") else "(none)"


_times = RunTimes()


def pytest_runtest_logreport(report) -> None:
    if not os.environ.get(ENABLE):
        return
    node = getattr(report, "node", None)          # set by xdist on the controller
    worker = getattr(getattr(node, "gateway", None), "id", None) or "main"
    _times.add(worker, report.nodeid, report.when, report.duration, time.monotonic())


def pytest_terminal_summary(terminalreporter) -> None:
    if not os.environ.get(ENABLE) or hasattr(terminalreporter.config, "workerinput"):
        return
    lines = _times.lines()
    if lines:
        terminalreporter.section("time per worker and group")
        for line in lines:
            terminalreporter.write_line(line)
