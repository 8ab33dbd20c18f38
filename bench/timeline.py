"""Where the machine's time went while a bench ran, next to the latencies it measured.

A `Sampler` thread reads /proc every `interval` seconds and keeps, per sample, the CPU
seconds each kind of process used since the last one: the web server (the processes under
its pid), PostgreSQL by role (backends, autovacuum, checkpointer and the other background
processes), Redis, the load generator (this process), kernel threads (writeback, the
journal) and the rest, with the machine's iowait and the dirty and writeback pages.

`slices()` cuts the measured requests into fixed slices by the time they were sent and
joins each with the samples that overlap it, so a slow slice comes with what ran during
it (`report()` prints the slowest ones against the median slice; `write_tsv()` keeps all).
Linux only; no Django."""
import os
import statistics
import threading
import time
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")
ROLES = ("web", "pg backends", "pg autovacuum", "pg background", "redis", "generator", "kernel threads", "other")
_PG_BACKGROUND = ("checkpointer", "background writer", "walwriter", "wal writer", "logical replication",
                  "stats collector", "archiver", "autovacuum launcher")


def percentile(values: list[float], pct: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(pct / 100 * (len(ordered) - 1))))]


def _processes() -> dict[int, tuple[int, str, float]]:
    """pid -> (parent pid, comm, CPU seconds so far) for every process we can read."""
    found = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry.name}/stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        found[int(entry.name)] = (int(fields[1]), comm, (int(fields[11]) + int(fields[12])) / TICK)
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _descendants(parents: dict[int, int], root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    seen, todo = {root}, [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in seen:
                seen.add(child)
                todo.append(child)
    return seen


def _machine() -> dict[str, float]:
    """CPU seconds by kind for the whole machine (/proc/stat) and pages dirty/under writeback."""
    cpu = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, idle, iowait, irq, softirq = (int(v) / TICK for v in cpu[:7])
    vm = dict(line.split() for line in Path("/proc/vmstat").read_text().splitlines())
    return {"busy": user + nice + system + irq + softirq, "iowait": iowait, "idle": idle,
            "dirty MB": int(vm.get("nr_dirty", 0)) * 4 / 1024, "writeback MB": int(vm.get("nr_writeback", 0)) * 4 / 1024}


class Sampler(threading.Thread):
    """Samples /proc every `interval` s until stopped; `web_pid` is the web server's master (or
    the masters of several hosts' web servers, bench/fleet.py --hosts). `kinds` names more
    process trees by their root pid (bench/store.py: {"watch": …, "jobs": …}): each is a role
    of its own, after "web"."""

    def __init__(self, web_pid: int | list[int], interval: float = 2.0, kinds: dict[str, int] | None = None):
        super().__init__(daemon=True, name="timeline")
        self.web_pid, self.interval, self.me = web_pid, interval, os.getpid()
        self.kinds = dict(kinds or {})
        self.roles = (ROLES[0], *self.kinds, *ROLES[1:])
        self.samples: list[dict] = []            # {"t": perf_counter, role: CPU s since the last, ...}
        self._stop_event = threading.Event()
        self._roles: dict[int, str] = {}

    def _role(self, pid: int, parent: int, comm: str, web: set[int], trees: dict[str, set[int]]) -> str:
        if pid in web:
            return "web"
        for kind, tree in trees.items():
            if pid in tree:
                return kind
        if pid == self.me:
            return "generator"
        if parent == 2 or pid == 2:
            return "kernel threads"
        if comm.startswith("postgres"):
            line = _cmdline(pid)
            if "autovacuum worker" in line:
                return "pg autovacuum"
            if any(name in line for name in _PG_BACKGROUND) or parent == 1 or "postgres:" not in line:
                return "pg background"
            return "pg backends"
        if comm.startswith("redis-server"):
            return "redis"
        return "other"

    def _take(self) -> tuple[float, dict[int, float], dict[int, str], dict[str, float]]:
        processes = _processes()
        parents = {pid: p[0] for pid, p in processes.items()}
        masters = self.web_pid if isinstance(self.web_pid, list) else [self.web_pid]
        web = set().union(*(_descendants(parents, master) for master in masters))
        trees = {kind: _descendants(parents, root) for kind, root in self.kinds.items()}
        roles = {}
        for pid, (parent, comm, _) in processes.items():
            # A PostgreSQL backend keeps its role; an autovacuum worker is a new pid each time.
            roles[pid] = self._roles.get(pid) or self._role(pid, parent, comm, web, trees)
        self._roles = roles
        return time.perf_counter(), {pid: p[2] for pid, p in processes.items()}, roles, _machine()

    def run(self) -> None:
        last = self._take()
        while not self._stop_event.wait(self.interval):
            now = self._take()
            sample = {"t": now[0], "seconds": now[0] - last[0], **dict.fromkeys(self.roles, 0.0)}
            for pid, cpu in now[1].items():
                sample[now[2][pid]] += cpu - last[1].get(pid, 0.0)   # a new process: all of its CPU
            for key in ("busy", "iowait"):
                sample[key] = now[3][key] - last[3][key]
            sample["dirty MB"], sample["writeback MB"] = now[3]["dirty MB"], now[3]["writeback MB"]
            self.samples.append(sample)
            last = now

    def stop(self) -> None:
        self._stop_event.set()
        self.join(5)


def slices(sampler: Sampler, sent_at: list[float], latencies: list[float], start: float, end: float,
           width: float = 5.0) -> list[dict]:
    """The requests sent in each `width`-second slice of [start, end): how many, their p50,
    p99 and max, and the CPU per role (in cores) of the samples that overlap the slice."""
    count = max(1, int((end - start) // width))
    buckets: list[list[float]] = [[] for _ in range(count)]
    for t, ms in zip(sent_at, latencies, strict=True):
        index = int((t - start) // width)
        if 0 <= index < count:
            buckets[index].append(ms)
    rows = []
    for index, bucket in enumerate(buckets):
        lo, hi = start + index * width, start + (index + 1) * width
        overlapping = [s for s in sampler.samples if s["t"] > lo and s["t"] - s["seconds"] < hi]
        seconds = sum(s["seconds"] for s in overlapping) or 1.0
        rows.append({"from s": index * width, "requests": len(bucket), "p50 ms": percentile(bucket, 50),
                     "p99 ms": percentile(bucket, 99), "max ms": max(bucket, default=0.0),
                     **{role: sum(s[role] for s in overlapping) / seconds
                        for role in (*sampler.roles, "busy", "iowait")},
                     "dirty MB": max((s["dirty MB"] for s in overlapping), default=0.0),
                     "writeback MB": max((s["writeback MB"] for s in overlapping), default=0.0)})
    return rows


def totals(sampler: Sampler) -> dict[str, float]:
    """Cores each role used on average over all the samples, and the machine's busy cores."""
    seconds = sum(s["seconds"] for s in sampler.samples) or 1.0
    return {role: sum(s[role] for s in sampler.samples) / seconds for role in (*sampler.roles, "busy", "iowait")}


_NOT_ROLES = {"from s", "requests", "p50 ms", "p99 ms", "max ms", "busy", "iowait", "dirty MB", "writeback MB"}


def _describe(row: dict) -> str:
    # The web server is the subject: always shown, even when a tiny run's share rounds to 0.
    roles = [key for key in row if key not in _NOT_ROLES]
    cores = ", ".join(f"{role} {row[role]:.2f}" for role in (*roles, "iowait") if row[role] >= 0.01 or role == "web")
    return (f"{row['requests']:.0f} sent, p99 {row['p99 ms']:.0f} ms, max {row['max ms']:.0f} ms; cores: {cores}; "
            f"machine busy {row['busy']:.2f} of 2; dirty {row['dirty MB']:.0f} MB, writeback {row['writeback MB']:.0f} MB")


def report(rows: list[dict], worst: int = 3, width: float = 5.0) -> list[str]:
    """The median slice, then the `worst` slices by p99, each with what ran meanwhile."""
    if not rows:
        return []
    median = {key: statistics.median(row[key] for row in rows) for key in rows[0]}
    lines = [f"  timeline ({len(rows)} slices of {width:g} s) median: {_describe(median)}"]
    for row in sorted(rows, key=lambda r: r["p99 ms"], reverse=True)[:worst]:
        lines.append(f"  slowest, from {row['from s']:g} s: {_describe(row)}")
    return lines


def write_tsv(rows: list[dict], path: str) -> None:
    with open(path, "w") as out:
        out.write("\t".join(rows[0]) + "\n")
        for row in rows:
            out.write("\t".join(f"{value:.3f}" if isinstance(value, float) else str(value) for value in row.values())
                      + "\n")
