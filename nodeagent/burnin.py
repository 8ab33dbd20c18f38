"""Burn-in: a diagnostic run on an idle card before it is sold (first sale, after every
lease, on an operator's request), sent to the storefront as a signed `burn_in` record
(PROTOCOL.md). The storefront sells a slot only with a passing record newer than its last
lease.

The diagnostic is DCGM's `dcgmi diag -r LEVEL -j -i GPU` where DCGM is installed; else the
configured fallback command (nodeagent/README.md: a bounded matmul and memory-pattern test
run in the instance image, exit 0 for pass, optional JSON on stdout). With neither, the
record says so and fails: an unproven card is never sold.

What runs depends on the card's class and the depth asked (nodeagent/gpu_checks.py,
docs/adr/0013-burn-in-by-card-class.md): DCGM level 3 (deep) or 1 (short) on a datacenter
card; level 1 and the fallback on a GeForce or workstation card. Every level adds four
checks with their figures (recovery action, PCIe link, host-to-device bandwidth from
nodeagent/gpu_bandwidth.py, remapped rows and retired pages); one failing fails the record.

A diagnostic takes minutes (level 3: tens of minutes), so it runs on a worker thread beside
the converge loop: reports and other leases' operations never wait for it."""
import json
import logging
import queue
import shutil
import subprocess
import threading
from dataclasses import dataclass, field

from . import gpu_bandwidth
from .gpu_checks import Limits, card_class, checks, depth_for_level, plan
from .journal import utc_now

log = logging.getLogger(__name__)
STATUSES = ("pass", "fail", "warn", "skip")
COUNTERS = ("ecc_uncorrected", "remapped_rows", "retired_pages_pending")


@dataclass
class BurnInConfig:
    dcgmi: str = "dcgmi"                 # name on PATH or a path
    fallback_command: list[str] = field(default_factory=list)   # {index}, {uuid} filled in
    timeout_seconds: int = 3600
    min_h2d_fraction: float = 0.6        # host-to-device bandwidth / the link's peak
    max_remapped_rows: int = 8
    max_retired_pages: int = 10
    bandwidth_command: list[str] = field(default_factory=list)  # [] = nodeagent.gpu_bandwidth

    def limits(self) -> Limits:
        return Limits(min_h2d_fraction=float(self.min_h2d_fraction),
                      max_remapped_rows=int(self.max_remapped_rows),
                      max_retired_pages=int(self.max_retired_pages))


@dataclass(frozen=True)
class Diagnosis:
    tool: str
    tool_version: str
    tests: list[dict]
    passed: bool
    detail: str = ""


def _status(text) -> str:
    status = str(text or "").strip().lower()
    return status if status in STATUSES else "fail"


def parse_dcgmi(output: str) -> tuple[str, list[dict]]:
    """(version, tests) from `dcgmi diag -j`: each test's per-GPU statuses (DCGM 3 names the
    top key "DCGM GPU Diagnostic", DCGM 4 "DCGM Diagnostic")."""
    data = json.loads(output)
    diag = data.get("DCGM GPU Diagnostic") or data.get("DCGM Diagnostic") or {}
    tests = []
    for category in diag.get("test_categories", []):
        for test in category.get("tests", []):
            statuses = [_status(r.get("status")) for r in test.get("results", [])] or ["skip"]
            worst = "fail" if "fail" in statuses else "warn" if "warn" in statuses else \
                "pass" if "pass" in statuses else "skip"
            info = "; ".join(str(r.get("info") or r.get("warnings") or "")
                             for r in test.get("results", []) if r.get("info") or r.get("warnings"))
            tests.append({"name": str(test.get("name", "?"))[:80],
                          "category": str(category.get("category", ""))[:40],
                          "status": worst, "info": info[:300]})
    version = str(data.get("version") or diag.get("version") or "")
    return version[:40], tests


class Diagnostics:
    """Runs the diagnostic for one GPU and says what ran and how it ended."""

    def __init__(self, config: BurnInConfig, run=subprocess.run):
        self.config, self._run = config, run

    def diagnose(self, *, index: int, uuid: str, level: int, fallback: bool = False) -> Diagnosis:
        """DCGM at `level` where it is installed, else the fallback; `fallback`: the card's
        class needs the fallback as well (GeForce, workstation), and fails without it."""
        dcgmi = shutil.which(self.config.dcgmi)
        dcgm = self._dcgmi(dcgmi, index=index, level=level) if dcgmi else None
        if dcgm is not None and not fallback:
            return dcgm
        if self.config.fallback_command:
            extra = self._fallback(index=index, uuid=uuid)
            return extra if dcgm is None else _both(dcgm, extra)
        if dcgm is not None:
            return _both(dcgm, self._failed("fallback", "this card's class needs the fallback "
                                                        "command (DCGM runs only level 1 on it)"))
        return Diagnosis(tool="none", tool_version="", passed=False, tests=[
            {"name": "diagnostic tool", "category": "", "status": "fail",
             "info": "neither dcgmi nor a fallback command is configured"}],
            detail="no diagnostic tool on this node")

    def _dcgmi(self, dcgmi: str, *, index: int, level: int) -> Diagnosis:
        argv = [dcgmi, "diag", "-r", str(level), "-j", "-i", str(index)]
        try:
            done = self._run(argv, capture_output=True, text=True,
                             timeout=self.config.timeout_seconds)
            version, tests = parse_dcgmi(done.stdout)
        except subprocess.TimeoutExpired:
            return self._failed("dcgmi", "timed out")
        except (ValueError, AttributeError) as exc:      # not the JSON dcgmi writes
            return self._failed("dcgmi", f"unreadable output: {exc}")
        passed = bool(tests) and all(t["status"] in ("pass", "skip", "warn") for t in tests) \
            and any(t["status"] == "pass" for t in tests)
        return Diagnosis(tool="dcgmi", tool_version=version, tests=tests, passed=passed,
                         detail="" if passed else _failed_names(tests) or done.stderr[-300:])

    def _fallback(self, *, index: int, uuid: str) -> Diagnosis:
        argv = [part.format(index=index, uuid=uuid) for part in self.config.fallback_command]
        try:
            done = self._run(argv, capture_output=True, text=True,
                             timeout=self.config.timeout_seconds)
        except subprocess.TimeoutExpired:
            return self._failed("fallback", "timed out")
        except OSError as exc:
            return self._failed("fallback", str(exc))
        tests = _fallback_tests(done.stdout) or [
            {"name": "fallback", "category": "", "status": "pass" if done.returncode == 0 else "fail",
             "info": done.stderr[-300:]}]
        passed = done.returncode == 0 and all(t["status"] != "fail" for t in tests)
        return Diagnosis(tool="fallback", tool_version=argv[0][:40], tests=tests, passed=passed,
                         detail="" if passed else _failed_names(tests) or f"exit {done.returncode}")

    @staticmethod
    def _failed(tool: str, detail: str) -> Diagnosis:
        return Diagnosis(tool=tool, tool_version="", passed=False, detail=detail, tests=[
            {"name": tool, "category": "", "status": "fail", "info": detail}])


def _detail(diagnosis: Diagnosis, *, moved: bool, failed_checks: list[dict], passed: bool) -> str:
    parts = [diagnosis.detail] if diagnosis.detail else []
    if moved:
        parts.append("health counters moved during the test")
    parts += [f"{c['name']}: {c['detail']}" for c in failed_checks]
    if not parts and not passed:
        parts.append("the card is unhealthy after the test")
    return "; ".join(parts)[:300]


def _both(dcgm: Diagnosis, extra: Diagnosis) -> Diagnosis:
    passed = dcgm.passed and extra.passed
    return Diagnosis(tool=f"dcgmi+{extra.tool}", tool_version=f"{dcgm.tool_version}+{extra.tool_version}"[:40],
                     tests=dcgm.tests + extra.tests, passed=passed,
                     detail="; ".join(d.detail for d in (dcgm, extra) if not d.passed))


def _fallback_tests(stdout: str) -> list[dict]:
    try:
        data = json.loads(stdout or "null")
    except ValueError:
        return []
    if not isinstance(data, dict) or not isinstance(data.get("tests"), list):
        return []
    return [{"name": str(t.get("name", "?"))[:80], "category": "",
             "status": _status(t.get("status")), "info": str(t.get("info", ""))[:300]}
            for t in data["tests"] if isinstance(t, dict)]


def _failed_names(tests: list[dict]) -> str:
    return ", ".join(t["name"] for t in tests if t["status"] == "fail")


def counters(readings: dict) -> dict:
    """The memory-health counters a diagnostic must not move (before/after)."""
    remap = readings.get("remapped_rows") or {}
    return {"ecc_uncorrected": readings.get("ecc_uncorrected", 0),
            "remapped_rows_uncorrectable": remap.get("uncorrectable", 0),
            "remapped_rows_pending": bool(remap.get("pending")),
            "retired_pages_pending": bool(readings.get("retired_pages_pending"))}


class BurnInRunner:
    """One diagnostic at a time on a worker thread; each request's signed record goes to
    the outbox; a finished op_id is journaled so a restart does not run it again."""

    def __init__(self, *, node: str, key, outbox, journal, probe, diagnostics: Diagnostics,
                 gpu_memory=None, bandwidth=None):
        self.node, self.key, self.outbox, self.journal = node, key, outbox, journal
        self.probe, self.diagnostics = probe, diagnostics
        config = diagnostics.config
        # uuid -> {"h2d_gbps", …} or {"error"}; a process of its own per measurement
        self.bandwidth = bandwidth or (lambda uuid: gpu_bandwidth.measure(
            uuid, command=config.bandwidth_command, timeout=min(config.timeout_seconds, 300)))
        self.gpu_memory = gpu_memory    # nodeagent.gpu_memory.GpuMemory: the last lease's data
        self._queue: queue.Queue = queue.Queue()
        self._queued: set[str] = set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._work, name="burn-in", daemon=True)
        self._thread.start()

    def submit(self, requests: list[dict], *, busy_gpus: set[int]) -> None:
        """Queue the requests not done or queued yet; never a GPU an instance uses."""
        for request in requests:
            op_id, index = request.get("op_id"), request.get("gpu")
            if not isinstance(op_id, str) or type(index) is not int:
                continue
            with self._lock:
                if op_id in self._queued or self.journal.is_done(f"burn_in:{op_id}"):
                    continue
                if index in busy_gpus:
                    log.warning("burn-in %s: GPU %s is in use by an instance; not run", op_id, index)
                    continue
                self._queued.add(op_id)
            self._queue.put(request)

    def idle(self) -> bool:
        with self._lock:
            return not self._queued

    def _work(self) -> None:
        while True:
            request = self._queue.get()
            try:
                self._run_one(request)
            except Exception:       # the thread must outlive one surprise
                log.exception("burn-in %s failed unexpectedly", request.get("op_id"))
            finally:
                with self._lock:
                    self._queued.discard(request["op_id"])

    def _readings(self, index: int):
        for info in self.probe.inventory():
            if info.index == index:
                return info
        return None

    def _run_one(self, request: dict) -> None:
        op_id, index = request["op_id"], request["gpu"]
        depth = request.get("depth")
        depth = depth if depth in ("deep", "short") else depth_for_level(request.get("level"))
        before = self._readings(index)
        card = card_class((before.readings or {}).get("brand") if before else None,
                          before.name if before else "")
        run = plan(card, depth)
        level = run.dcgm_level
        started = utc_now()
        measured = None
        not_clean = self.gpu_memory.not_clean(before.uuid) if self.gpu_memory and before else ""
        if before is None:
            diagnosis = Diagnostics._failed("nvml", f"GPU {index} not found by NVML")
        elif not_clean:
            # A card whose memory may hold the last tenant's data is never passed for sale.
            diagnosis = Diagnostics._failed("gpu_memory", f"GPU memory not cleared: {not_clean}")
        else:
            log.info("burn-in %s: GPU %s (%s), %s: DCGM level %s%s", op_id, index, card, depth,
                     level, " and the fallback" if run.fallback else "")
            diagnosis = self.diagnostics.diagnose(index=index, uuid=before.uuid, level=level,
                                                  fallback=run.fallback)
            measured = self.bandwidth(before.uuid)
        after = self._readings(index)
        moved = before is not None and after is not None and \
            counters(after.readings) != counters(before.readings)
        found = checks(after.readings, measured, self.diagnostics.config.limits()) \
            if after is not None and measured is not None else []
        failed_checks = [c for c in found if c["status"] == "fail"]
        passed = diagnosis.passed and after is not None and after.healthy and not moved \
            and bool(found) and not failed_checks
        record = {
            "kind": "burn_in", "node": self.node, "op_id": op_id, "gpu_index": index,
            "gpu_uuid": before.uuid if before else "", "at": utc_now(), "started_at": started,
            "tool": diagnosis.tool, "tool_version": diagnosis.tool_version, "level": level,
            "depth": depth, "card_class": card, "fallback": run.fallback,
            "driver": before.driver if before else "", "tests": diagnosis.tests,
            "checks": found,
            "counters_before": counters(before.readings) if before else {},
            "counters_after": counters(after.readings) if after else {},
            "result": "pass" if passed else "fail",
            "detail": _detail(diagnosis, moved=moved, failed_checks=failed_checks, passed=passed),
        }
        self.outbox.add(self.key.sign_record(record))
        self.journal.done(0, f"burn_in:{op_id}", result=record["result"])
        log.info("burn-in %s: %s", op_id, record["result"])
