"""The agent loop: GET the desired state, converge, POST a signed report; repeat.

Losing the storefront never stops anything: without an answer the agent changes nothing,
backs off and retries, and the instances keep running as they are."""
import logging
import random
import threading
import time
from urllib.parse import urlsplit

from . import __version__
from .backends import open_disks, open_runtime
from .burnin import BurnInRunner, Diagnostics
from .client import StorefrontClient, StorefrontRefused, StorefrontUnreachable
from .config import AgentConfig
from .converge import Converger
from .gpu import gpu_report, open_gpu_probe
from .gpu_attachment import AttachmentCheck
from .gpu_memory import GpuMemory
from .interfaces import OperationFailed
from .journal import Journal, utc_now
from .netfilter import FilterGuard
from .outbox import Outbox
from .signing import NodeKey
from .state import StateDir, read_json, write_json
from .telemetry import Telemetry, TelemetrySampler
from .volumes import Volumes

log = logging.getLogger(__name__)
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"


def boot_id(path: str = BOOT_ID_PATH) -> str:
    """The kernel's id of this boot: the storefront asks for a short burn-in of every idle
    card when it changes (the node rebooted). "" where the kernel does not say."""
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""

REPLAY_SKIP = 1000   # after a restored state dir, jump past the seq the server last saw
MAX_EVIDENCE_PER_REPORT = 50   # keeps a report well under the storefront's 256 KB limit
FULL_GPU_REPORT_EVERY = 20     # reports without GPUs in a row at most (5 min at a 15 s poll)
MAX_PASSES_PER_ROUND = 3       # converge + report again while the answer brings a new desired state
# After a watch said the desired state changed, the next round starts at once, but this long
# after the last one began at the earliest: a state that keeps moving cannot spin the agent
# against its rate limit.
MIN_ROUND_GAP_SECONDS = 0.5
STOP_CHECK_SECONDS = 0.2       # how soon a stop ends a wait for the storefront's watch
WATCH_AT_LEAST_SECONDS = 1.0   # a shorter rest of the interval is slept, not watched
WATCH_HELD_SECONDS = 10.0      # a wait held this long (or half the time asked) was really held


def warn_if_cleartext(url: str) -> None:
    host = urlsplit(url).hostname or ""
    if urlsplit(url).scheme != "https" and host not in ("localhost", "127.0.0.1", "::1"):
        log.warning("storefront %s is not HTTPS: the node credential travels in clear", url)


class NotEnrolled(Exception):
    """No credential or no signing key: the agent refuses to run (enrol first)."""


def load_identity(state: StateDir) -> tuple[dict, NodeKey]:
    enrolment = read_json(state.enrolment_path, None)
    if not enrolment or not enrolment.get("credential"):
        raise NotEnrolled(f"no node credential in {state.enrolment_path}: run "
                          "`gpu-node-agent enrol --url URL --code CODE` first")
    if not state.key_path.exists():
        raise NotEnrolled(f"no signing key at {state.key_path}: enrol again")
    return enrolment, NodeKey.load(state.key_path)


class Agent:
    def __init__(self, config: AgentConfig, *, runtime=None, disks=None, probe=None):
        self.config = config
        self.state = StateDir(config.state_dir)
        enrolment, self.key = load_identity(self.state)
        self.node = enrolment["node"]
        self.poll_seconds = float(enrolment.get("poll_seconds", 15))
        self.client = StorefrontClient(config.storefront_url or enrolment["url"],
                                       credential=enrolment["credential"],
                                       verify=config.tls_verify,
                                       timeout=config.request_timeout)
        self.probe = probe or open_gpu_probe(max_temperature_c=config.max_temperature_c,
                                             min_cuda=config.min_cuda)
        self.outbox = Outbox(self.state.outbox_path)
        # GPU telemetry (PROTOCOL.md "Telemetry"): sampled on its own thread, sent with reports
        self.telemetry = (Telemetry(self.probe, self.state.root / "telemetry.json",
                                    every_seconds=config.telemetry_seconds,
                                    max_samples=config.telemetry_buffer_samples,
                                    per_report=config.telemetry_samples_per_report,
                                    send_minutes=config.telemetry_send_minutes)
                          if config.telemetry_seconds and hasattr(self.probe, "telemetry") else None)
        gpu_memory = GpuMemory(config.gpu_memory, self.state.root / "gpu-memory.json")
        self.burn_in = BurnInRunner(node=self.node, key=self.key, outbox=self.outbox,
                                    journal=Journal(self.state.root / "burn-in.json"),
                                    probe=self.probe, diagnostics=Diagnostics(config.burn_in),
                                    gpu_memory=gpu_memory)
        self.converger = Converger(
            node=self.node, runtime=runtime or open_runtime(config),
            disks=disks or open_disks(config), journal=Journal(self.state.journal_path),
            outbox=self.outbox, key=self.key, images=config.images,
            public_host=config.public_host,
            volumes=Volumes(config.state_dir / "volumes", client=config.volume_client),
            gpu_memory=gpu_memory)
        # after an upgrade: does each running instance still reach its GPUs?
        self.attachment = AttachmentCheck(self.state.root, __version__)
        self.failures = 0
        self.watching = config.watch    # ask the storefront to answer a change at once
        # ... and, where it can, as the answer to the round's report (POST /agent/v1/report/watch)
        self.reports_wait = config.watch
        self._report_waited = False      # this round's report was held: its wait is spent
        self._round_started = time.monotonic()
        self._stop: threading.Event | None = None
        self._held: dict | None = None   # the desired state the last report's answer carried
        self._gpus_sent: list | None = None   # the GPUs as last accepted (temperature aside)
        self._reports_since_gpus = 0
        # Where the count toward the next full GPU report starts after this start's first
        # one: a fleet restarted together (a rollout, a power cut) would otherwise send its
        # GPUs in the same poll interval every FULL_GPU_REPORT_EVERY polls, a burst of the
        # costliest reports.
        self._gpu_phase: int | None = random.randrange(FULL_GPU_REPORT_EVERY)

    def run_forever(self, stop: threading.Event) -> None:
        log.info("node %s: agent %s polling %s", self.node, __version__, self.client.url)
        warn_if_cleartext(self.client.url)
        self._stop = stop
        guard = self._start_filter_guard()
        sampler = TelemetrySampler(self.telemetry).start() if self.telemetry is not None else None
        try:
            while not stop.is_set():
                try:
                    delay = self.run_once()
                except Exception as exc:  # never exit on a surprise: the instances stay up anyway
                    log.exception("agent round failed")
                    delay = self._back_off(exc)
                self._until_next_round(delay, stop)
        finally:
            if guard is not None:
                guard.stop()
            if sampler is not None:
                sampler.stop()

    def _until_next_round(self, delay: float, stop: threading.Event) -> None:
        """Wait `delay` seconds, or less: after a good round the storefront is asked to answer
        as soon as the desired state moves past the version this node holds (PROTOCOL.md,
        the watch), so a paid lease starts within about a second, not on the next poll. A
        storefront that predates the watch, or does not answer it, leaves the plain poll."""
        version = self.client.desired_version
        if self.failures or not self.watching or not version or delay <= 0:
            stop.wait(delay)
            return
        deadline = time.monotonic() + delay
        while (remaining := deadline - time.monotonic()) > WATCH_AT_LEAST_SECONDS:
            asked = time.monotonic()
            answer = self._watch_until_stopped(version, remaining, stop)
            if stop.is_set():
                return
            if answer is True:
                self._held = None          # the next round fetches the new document
                since_round = time.monotonic() - getattr(self, "_round_started", 0.0)
                if since_round < MIN_ROUND_GAP_SECONDS:
                    stop.wait(MIN_ROUND_GAP_SECONDS - since_round)
                return
            if answer is not False:        # refused or unanswered: sleep out the interval
                if isinstance(answer, StorefrontRefused) and answer.status in (404, 405):
                    log.info("the storefront has no desired-state watch: polling every %.0fs", delay)
                    self.watching = False
                break
            # "Unchanged": asked again for the time left only if the storefront held the wait
            # (it caps one at NODE_WATCH_MAX_SECONDS, below a long interval). One answered at
            # once (a WSGI server does not hold) would make asking again a busy loop.
            if time.monotonic() - asked < min(remaining / 2, WATCH_HELD_SECONDS):
                break
        stop.wait(max(0.0, deadline - time.monotonic()))

    def _report(self, report: dict) -> dict | None:
        """The report sent; while the node watches, as the report that waits (PROTOCOL.md):
        answered when the desired state moves or the rest of this round's interval has
        passed, so a steady node makes one request an interval, not a report and a watch.
        None: a stop came while it was held."""
        version = self.client.desired_version
        remaining = self.poll_seconds - (time.monotonic() - self._round_started)
        if not (self.reports_wait and self.watching and version and remaining > WATCH_AT_LEAST_SECONDS):
            return self.client.report(report, self.key)
        answer = self._until_stopped(lambda: self.client.report(report, self.key, wait_from=(version, remaining)))
        if isinstance(answer, StorefrontRefused) and answer.status in (404, 405):
            log.info("the storefront holds no report: reporting, then watching")
            self.reports_wait = False
            return self.client.report(report, self.key)   # it was not taken: the same seq is new
        if isinstance(answer, Exception):
            raise answer
        self._report_waited = answer is not None
        return answer

    def _watch_until_stopped(self, version: str, delay: float, stop: threading.Event):
        """The watch's answer (True/False, or the StorefrontRefused/StorefrontUnreachable it
        raised)."""
        return self._until_stopped(lambda: self.client.watch(version, delay), stop)

    def _until_stopped(self, call, stop: threading.Event | None = None):
        """`call()`'s result, or the StorefrontRefused/StorefrontUnreachable it raised, or None
        when a stop came first: asked from a thread of its own so that a stop (SIGTERM: an
        upgrade, systemd) ends a held wait at once instead of after it; the abandoned call
        dies with the process."""
        stop = stop if stop is not None else self._stop
        if stop is None:
            try:
                return call()
            except (StorefrontRefused, StorefrontUnreachable) as exc:
                return exc
        answer: list = []
        done = threading.Event()

        def ask():
            try:
                answer.append(call())
            except (StorefrontRefused, StorefrontUnreachable) as exc:
                answer.append(exc)
            except Exception as exc:     # never let a surprise end the loop: poll instead
                log.exception("a held call to the storefront failed")
                answer.append(StorefrontUnreachable(str(exc)))
            finally:
                done.set()

        threading.Thread(target=ask, name="storefront-wait", daemon=True).start()
        while not done.wait(STOP_CHECK_SECONDS):
            if stop.is_set():
                return None
        return answer[0]

    def _start_filter_guard(self) -> FilterGuard | None:
        """The packet filter checked on its own timer: a round can be minutes away (the
        storefront back-off) and a flushed table must not wait for it. A runtime without
        a packet filter (tests' NoInstances) has nothing to guard."""
        packet_filter = getattr(self.converger.runtime, "filter", None)
        if packet_filter is None:
            return None
        return FilterGuard(packet_filter, self.config.filter_guard_seconds).start()

    def run_once(self) -> float:
        """One round; returns how long to wait before the next.

        The report's answer carries the desired state (PROTOCOL.md), so a steady
        round is one request: converge to the desired state held, report, and when the
        answer brings a new one converge to it (and report that) in the same round. A
        storefront that predates it is asked with GET /agent/v1/desired every round."""
        self._round_started = time.monotonic()
        self._guard()
        self._report_waited = False
        try:
            desired = self._held if self._held is not None else self.client.desired()
            for _ in range(MAX_PASSES_PER_ROUND):
                self.poll_seconds = float(desired.get("poll_seconds", self.poll_seconds))
                gpus = self.attachment.apply(self.probe.inventory(), self.converger.runtime)
                instances = self.converger.converge(desired.get("instances", []), gpus,
                                                    desired.get("storage"))
                self.burn_in.submit(desired.get("burn_in") or [],
                                    busy_gpus=_gpus_in_use(desired.get("instances", [])))
                answer = self._send_report(gpus, instances)
                fresh = self.client.desired_from(answer)
                self._held = fresh
                if fresh is None or fresh is desired:
                    break
                desired = fresh
        except (StorefrontUnreachable, StorefrontRefused) as exc:
            self._held = None            # ask afresh once the storefront answers again
            return self._back_off(exc)
        self.failures = 0
        if self._report_waited:          # the next round is due an interval after this one began
            return max(0.0, self.poll_seconds - (time.monotonic() - self._round_started))
        return self.poll_seconds

    def _guard(self) -> None:
        """The packet filter follows the leases Docker has, every round (FilterGuard also
        restores it between rounds, with the lease set last written)."""
        try:
            self.converger.runtime.guard()
        except OperationFailed as exc:
            log.error("isolation: %s", exc)

    def _send_report(self, gpus, instances) -> dict:
        evidence = self.outbox.pending()[:MAX_EVIDENCE_PER_REPORT]
        gpu_items = [gpu_report(g) for g in gpus]
        # The GPUs only when they changed (temperature aside) since the last
        # accepted report, and at least every FULL_GPU_REPORT_EVERY reports (PROTOCOL.md).
        steady = [{k: v for k, v in g.items() if k != "temperature_c"} for g in gpu_items]
        send_gpus = steady != self._gpus_sent or self._reports_since_gpus >= FULL_GPU_REPORT_EVERY
        report = {"seq": self.state.next_seq(), "sent_at": utc_now(),
                  "agent_version": __version__, "public_host": self.config.public_host,
                  **({"boot_id": boot} if (boot := boot_id()) else {}),
                  **({"gpus": gpu_items} if send_gpus else {}), "gpu_library": self.probe.library,
                  "instances": instances, "evidence": evidence}
        telemetry = self.telemetry.batch() if self.telemetry is not None else None
        if telemetry is not None:
            report["telemetry"] = telemetry
        try:
            answer = self._report(report)
        except StorefrontRefused as exc:
            if exc.error == "replayed":
                self.state.skip_seq(REPLAY_SKIP)
            raise
        if answer is None:                      # stopped while the storefront held it
            return {}
        if self.telemetry is not None:
            self.telemetry.settle(answer)       # kept for the next report unless answered
        if send_gpus:
            self._gpus_sent, self._reports_since_gpus = steady, self._gpu_phase or 0
            self._gpu_phase = None
        else:
            self._reports_since_gpus += 1
        for record, error in self.outbox.settle(evidence, answer):
            log.error("storefront refused %s evidence for lease %s (%s): dropped",
                      record.get("kind"), record.get("lease_id"), error)
        for refused in answer.get("refused", []):
            if not str(refused.get("item", "")).startswith("evidence["):
                log.warning("storefront refused %s: %s", refused.get("item"),
                            refused.get("error"))
        self._write_status(last_report_at=report["sent_at"], instances=instances,
                           gpus=gpu_items, last_error=None)
        return answer

    def _back_off(self, exc: Exception) -> float:
        self.failures += 1
        delay = min(self.config.max_backoff_seconds,
                    self.poll_seconds * 2 ** min(self.failures - 1, 10))
        delay *= random.uniform(0.8, 1.0)   # do not let a fleet retry in lockstep
        log.warning("storefront: %s; instances left as they are, retry in %.0fs", exc, delay)
        self._write_status(last_error=str(exc))
        return delay

    def _write_status(self, **facts) -> None:
        status = read_json(self.state.status_path, {})
        status.update(facts, node=self.node, storefront=self.client.url, updated_at=utc_now(),
                      gpu_library=self.probe.library)
        write_json(self.state.status_path, status)


def _gpus_in_use(instances: list[dict]) -> set[int]:
    """GPUs an instance holds (or may start on): never given to a diagnostic."""
    return {g for item in instances if isinstance(item, dict) and item.get("want") != "absent"
            for g in item.get("gpus") or [] if type(g) is int}
