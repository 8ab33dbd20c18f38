"""Bring each lease of the desired state about, one idempotent step at a time, and say
what happened: the observed state, the last named failure, signed evidence."""
import hashlib
import json
import logging
import time

from .image_refs import normalise_reference
from .interfaces import DiskEvidence, GpuInfo, InstanceSpec, InstanceStatus, OperationFailed
from .item_fields import environment as _environment
from .item_fields import non_negative as _non_negative
from .item_fields import registry_auth as _registry_auth
from .item_fields import start_command as _start_command
from .journal import Journal, utc_now
from .outbox import Outbox
from .runtime.ports import BAD_PORTS, parse_ports
from .signing import NodeKey
from .snapshots import Job, Jobs, Repository, restore_snapshot, take_snapshot

log = logging.getLogger(__name__)

WANTS = ("running", "stopped", "absent")
DISK_ACTIONS = ("keep", "destroy_key", "wipe")
# under way beside the loop: the observed state, not "failed"
PENDING = ("image_pulling", "snapshot_restoring")


class Converger:
    def __init__(self, *, node: str, runtime, disks, journal: Journal, outbox: Outbox,
                 key: NodeKey, images: dict[str, str], public_host: str, volumes=None,
                 gpu_memory=None):
        self.node, self.runtime, self.disks = node, runtime, disks
        self.journal, self.outbox, self.key = journal, outbox, key
        self.images, self.public_host = images, public_host
        self.volumes = volumes          # nodeagent.volumes.Volumes: network volumes
        self.storage = None             # the desired state's `storage` (how to reach the CephFS)
        self.jobs = Jobs()              # snapshots and restores on worker threads
        # nodeagent.gpu_memory.GpuMemory: a released GPU's memory zeroed before the next lease
        self.gpu_memory = gpu_memory
        self._listed: list[dict] = []   # this pass's desired instances (which GPUs are taken)
        self._gpus: list[GpuInfo] = []

    def converge(self, instances: list[dict], gpus: list[GpuInfo], storage: dict | None = None) -> list[dict]:
        """One report item per desired lease, plus the leases this node still runs that
        the storefront no longer lists (left alone: only `want: absent` removes)."""
        self.storage = storage if isinstance(storage, dict) else None
        instances = [item for item in instances if _well_formed(item)]
        self._listed, self._gpus = instances, gpus
        self._resume_interrupted()
        # Releases first: a GPU's memory is cleared before a lease listed after it starts on it.
        order = sorted(range(len(instances)), key=lambda i: instances[i].get("want") != "absent")
        done = {i: self._with_jobs(instances[i], self._with_volumes(
            instances[i], self._converge_one(instances[i], gpus))) for i in order}
        reports = [done[i] for i in range(len(instances))]
        listed = {item["lease_id"] for item in instances}
        for lease_id in self._runtime_leases():
            if lease_id not in listed:
                reports.append(self._report(lease_id, "", self.runtime.status(lease_id)))
        self._forget_finished_leases(listed)
        return reports

    def _forget_finished_leases(self, listed: set[int]) -> None:
        """The journal keeps a lease until its disk was wiped and the storefront stopped
        listing it: nothing can be asked of it any more."""
        for lease_id in self.journal.leases() - listed:
            if self.journal.is_done(f"lease:{lease_id}:disk_wiped"):
                self.journal.forget_lease(lease_id)
                if self.gpu_memory is not None:
                    self.gpu_memory.forget(lease_id)

    def _converge_one(self, item: dict, gpus: list[GpuInfo]) -> dict:
        lease_id, op_id = item["lease_id"], item["op_id"]
        try:
            status = self.runtime.status(lease_id)
            if self.jobs.busy(lease_id):     # its snapshot or restore runs: other steps wait
                return self._report(lease_id, op_id, status)
            if self.journal.is_done(op_id) and _satisfied(item["want"], status.state) and \
                    (status.state != "running" or self.disks.is_ready(lease_id)) and \
                    self._ports_current(item, status) and self._workbench_current(item, status):
                return self._report(lease_id, op_id, status)
            status = self._apply(item, gpus)
            self.journal.done(lease_id, op_id, state=status.state, **_workbench_fact(item, status))
            log.info("lease %s: %s done (%s)", lease_id, op_id, status.state)
            return self._report(lease_id, op_id, status)
        except OperationFailed as exc:
            log.warning("lease %s: %s failed: %s", lease_id, op_id, exc)
            self.journal.failed(lease_id, op_id, exc.code, exc.detail)
        except (KeyError, TypeError, ValueError) as exc:
            self.journal.failed(lease_id, op_id, "bad_desired_state", repr(exc))
        except Exception as exc:     # one lease's surprise must not stop the others
            log.exception("lease %s: %s failed unexpectedly", lease_id, op_id)
            self.journal.failed(lease_id, op_id, "agent_error", repr(exc))
        status = self._safe_status(lease_id)
        report = self._report(lease_id, op_id, status)
        pending = (report["error"] or {}).get("code") in PENDING
        if (report["error"] or {}).get("code") == "image_pulling":
            pull = self._pull_progress(item)
            if pull is not None:
                report["pull"] = pull
        if not _satisfied(item.get("want"), status.state) and not pending:
            report["state"] = "failed"
        return report

    # -- steps -------------------------------------------------------------------------
    def _apply(self, item: dict, gpus: list[GpuInfo]) -> InstanceStatus:
        lease_id, op_id, want = item["lease_id"], item["op_id"], item["want"]
        disk = item.get("disk", "keep")
        if want not in WANTS or disk not in DISK_ACTIONS:
            raise OperationFailed("bad_desired_state", f"want={want!r} disk={disk!r}")
        if disk != "keep" and want != "absent":
            raise OperationFailed("disk_error", f"disk {disk} needs the instance absent")
        if disk == "keep" and self.journal.is_done(f"lease:{lease_id}:disk_wiped"):
            # The lease moved off this node, the copy it left was wiped, and it is back: on a
            # new disk, so nothing journaled of the old one (its key destroyed, its wipe, a
            # restore into it) may skip a step for the new one.
            log.info("lease %s: back on this node after its earlier disk here was wiped", lease_id)
            self.journal.forget_lease(lease_id)
        if want == "running":
            status = self._run(item, gpus)
        elif want == "stopped":
            status = self.runtime.ensure_stopped(lease_id)
        else:
            status = self.runtime.ensure_absent(lease_id)
            if self.gpu_memory is not None:     # the instance is gone: nothing uses its GPUs
                self.gpu_memory.release(lease_id, in_use=self._gpus_in_use(but=lease_id))
            if self.volumes is not None:
                self.volumes.release(lease_id)
            self.disks.detach(lease_id)
        if disk in ("destroy_key", "wipe"):
            self._once(lease_id, op_id, "key_destroyed", self.disks.destroy_key)
        if disk == "wipe":
            self._once(lease_id, op_id, "disk_wiped", self.disks.wipe)
        return status

    def _run(self, item: dict, gpus: list[GpuInfo]) -> InstanceStatus:
        """The only path that starts a container: after the disk is opened and mounted,
        and checked mounted where dockerd sees it. Containers have no restart policy, so
        after a reboot nothing runs until this has mounted the disk again."""
        lease_id = item["lease_id"]
        if self.runtime.status(lease_id).state == "running" and not self.disks.is_ready(lease_id):
            log.error("lease %s: running without its disk mounted: stopping it", lease_id)
            self.runtime.ensure_stopped(lease_id)
        image, customer = self._instance_image(item)
        spec = InstanceSpec(
            lease_id=lease_id,
            image=image, customer_image=customer,
            registry_auth=_registry_auth(item.get("registry_auth")) if customer else None,
            image_max_bytes=_non_negative(item.get("image_max_bytes", 0), "image_max_bytes"),
            env=_environment(item.get("env")),
            start_command=_start_command(item.get("start_command")),
            gpu_uuids=self._gpu_uuids(item["gpus"], gpus),
            ssh_authorized_keys=tuple(item.get("ssh_authorized_keys", ())),
            cpus=int(item["cpus"]), memory_gb=int(item["memory_gb"]),
            shm_gb=int(item.get("shm_gb", 0)),
            disk_path=self.disks.ensure_ready(lease_id, int(item["disk_gb"])),
            volumes_path=self.volumes.prepare(lease_id) if self.volumes and self.storage else "",
            ports=self._wanted_ports(item))
        self._restore_first(item, spec.disk_path)
        if self.runtime.status(lease_id).state == "running":
            # A new op_id for a running instance means "restart" (PROTOCOL.md): files kept.
            log.info("lease %s: restarting for %s", lease_id, item["op_id"])
            self.runtime.ensure_stopped(lease_id)
        if not self.disks.is_ready(lease_id):
            raise OperationFailed("disk_not_mounted", f"lease {lease_id}'s disk is not mounted "
                                  f"at {spec.disk_path} where dockerd sees it: not starting")
        if self.gpu_memory is not None:     # known before it runs: a crash cannot lose it
            self.gpu_memory.hold(lease_id, spec.gpu_uuids)
        status = self.runtime.ensure_running(spec)
        marker = f"{item['op_id']}:instance_ready"
        if not self.journal.is_done(marker):        # one record per op, not per (re)start
            self._evidence("instance_ready", lease_id, item["op_id"], {
                "ssh_port": status.ssh_port, "host": self.public_host,
                "gpus": list(spec.gpu_uuids), "image": item["image"],
                **({"image_ref": spec.image} if customer else {})})
            self.journal.done(lease_id, marker)
        return status

    def _workbench_current(self, item: dict, status: InstanceStatus) -> bool:
        """False when a running instance's image, start command or variables are no longer
        the item's (PROTOCOL.md: a change recreates the container, the disk kept): the
        storefront changes them without a new op_id, so the finished op alone says nothing."""
        if item.get("want") != "running" or status.state != "running":
            return True
        applied = self.journal.finished().get(item["op_id"], {}).get("workbench")
        if applied is None or applied == _workbench_digest(item):   # None: journaled before this check
            return True
        log.info("lease %s: image, start command or variables changed: recreating its instance",
                 item["lease_id"])
        return False

    def _wanted_ports(self, item: dict):
        return parse_ports(item.get("ports"), limit=getattr(self.runtime, "max_published_ports", None))

    def _ports_current(self, item: dict, status: InstanceStatus) -> bool:
        """Every pass, whatever the op: a running instance's published ports admit the
        sources the item lists now (the packet filter alone changes, the instance keeps
        running); False when the item publishes other ports than the instance does (the
        container is recreated, its disk kept). A list that does not parse closes the
        lease's ports and fails it with the reason (`bad_ports`) until a good one comes."""
        if item.get("want") != "running" or status.state != "running":
            return True
        try:
            wanted = self._wanted_ports(item)
        except OperationFailed:
            if status.ports:
                self.runtime.allow_ports(item["lease_id"], ())
            raise
        if [p.port for p in wanted] != [port for port, _ in status.ports]:
            log.info("lease %s: published ports change: recreating its instance", item["lease_id"])
            return False
        if wanted:
            self.runtime.allow_ports(item["lease_id"], wanted)
        error = self.journal.error_for(item["lease_id"], item["op_id"])
        if error and error["code"] == BAD_PORTS:       # the list that failed is good now
            self.journal.done(item["lease_id"], item["op_id"], state=status.state)
        return True

    # -- snapshots and restores (nodeagent/snapshots.py) -------------------------
    def _resume_interrupted(self) -> None:
        """An instance paused by a snapshot this process is not running (the agent was
        killed mid-snapshot) runs again; the snapshot itself is retried."""
        busy = {lease for lease in self._runtime_leases() if self.jobs.busy(lease)}
        try:
            self.runtime.unpause_all(except_leases=busy)
        except OperationFailed as exc:
            log.warning("cannot resume paused instances: %s", exc)

    def _with_jobs(self, item: dict, report: dict) -> dict:
        """Every pass: start, follow or settle the lease's snapshot op; report both jobs.
        A running snapshot the storefront no longer sends is cancelled (restic killed)."""
        lease_id = item["lease_id"]
        wanted = item.get("snapshot")
        if isinstance(wanted, dict) and isinstance(wanted.get("op_id"), str) and wanted["op_id"]:
            report["snapshot"] = {"snapshot_id": wanted.get("snapshot_id"), **self._snapshot(item, wanted)}
        elif self.jobs.cancel(f"snapshot:{lease_id}") is not None:
            log.warning("lease %s: snapshot no longer asked for: cancelled", lease_id)
        wanted_restore = item.get("restore")
        if isinstance(wanted_restore, dict) and wanted_restore.get("replace") and item.get("want") == "stopped":
            self._restore_into(item, wanted_restore)
        restore = self.jobs.get(f"restore:{lease_id}")
        if restore is not None:
            report["restore"] = {"snapshot_id": (item.get("restore") or {}).get("snapshot_id"),
                                 **restore.report()}
        return report

    def _snapshot(self, item: dict, wanted: dict) -> dict:
        """One snapshot op, once: a failed op is reported failed until the storefront sends
        the snapshot's next attempt (a new op_id); an older attempt still running is
        cancelled first (one restic per lease)."""
        lease_id, op_id, key = item["lease_id"], wanted["op_id"], f"snapshot:{item['lease_id']}"
        if self.journal.is_done(op_id):
            return {"op_id": op_id, "state": "done", "error": None}
        job = self.jobs.get(key)
        if job is not None and job.op_id == op_id and job.state == "done":
            self._evidence("snapshot_taken", lease_id, op_id,
                           {"snapshot_id": wanted.get("snapshot_id"), **job.result})
            self.journal.done(lease_id, op_id, snapshot_id=wanted.get("snapshot_id"))
            self.jobs.forget(key)
            return {"op_id": op_id, "state": "done", "error": None}
        if job is not None and job.op_id != op_id and job.state == "running":
            log.warning("lease %s: snapshot %s replaced by %s: cancelling it", lease_id, job.op_id, op_id)
            job.cancel()
            return {"op_id": op_id, "state": "waiting", "error": None}
        if isinstance(item.get("restore"), dict) and not self.journal.is_done(f"lease:{lease_id}:restored"):
            return {"op_id": op_id, "state": "waiting", "error": None}     # copy what was restored, not half
        if job is None or job.op_id != op_id:
            job = Job("snapshot", op_id)
            try:
                work = self._snapshot_work(item, wanted)
            except OperationFailed as exc:
                job.state, job.error, job.ended = "failed", (exc.code, exc.detail), time.monotonic()
                self.jobs.put(key, job)
                return job.report()
            log.info("lease %s: snapshot %s starting", lease_id, op_id)
            self.jobs.start(key, job, work)
        return job.report()

    def _snapshot_work(self, item: dict, wanted: dict):
        lease_id = item["lease_id"]
        repo = Repository.from_desired(wanted.get("repository"))
        if not self.disks.is_ready(lease_id):
            raise OperationFailed("snapshot_failed", f"lease {lease_id}'s disk is not mounted on this node")
        source = self.disks.mount_path(lease_id)
        tags = [f"lease-{lease_id}", f"snapshot-{wanted.get('snapshot_id')}"]
        return lambda job: take_snapshot(job, repo=repo, source=source, tags=tags,
                                         pause=lambda: self.runtime.pause(lease_id),
                                         resume=lambda: self.runtime.unpause(lease_id))

    def _restore_first(self, item: dict, disk_path: str) -> None:
        """`restore` on a running op: the snapshot is restored into the fresh disk before the
        instance is first created (never over files an instance already wrote)."""
        wanted = item.get("restore")
        lease_id = item["lease_id"]
        marker, key = f"lease:{lease_id}:restored", f"restore:{lease_id}"
        if not isinstance(wanted, dict) or self.journal.is_done(marker):
            return
        job = self.jobs.get(key)
        if job is not None and job.state == "done":
            self._evidence("snapshot_restored", lease_id, item["op_id"],
                           {"snapshot_id": wanted.get("snapshot_id"), **job.result})
            self.journal.done(lease_id, marker)
            return
        if self.runtime.status(lease_id).state != "absent":
            raise OperationFailed("snapshot_restore_failed", f"lease {lease_id}'s instance already exists: "
                                  "a snapshot is restored only into a new lease's disk")
        if job is None or self.jobs.due_again(key):
            repo = Repository.from_desired(wanted.get("repository"))
            restic_snapshot = str(wanted.get("restic_snapshot") or "")
            if not restic_snapshot:
                raise OperationFailed("bad_desired_state", "restore needs restic_snapshot")
            self.jobs.start(key, Job("restore", item["op_id"]), lambda job: restore_snapshot(
                job, repo=repo, restic_snapshot=restic_snapshot, target=disk_path))
            raise OperationFailed("snapshot_restoring", f"restoring snapshot {wanted.get('snapshot_id')}")
        if job.state == "running":
            raise OperationFailed("snapshot_restoring", f"restoring snapshot {wanted.get('snapshot_id')}")
        raise OperationFailed(*job.error)

    def _restore_into(self, item: dict, wanted: dict) -> None:
        """`restore` with `replace` on a stopped item: the snapshot replaces what the lease's
        existing disk holds (the customer asked, with the instance stopped), once per restore
        `op_id`; the instance stays stopped until the customer starts it."""
        lease_id, op_id = item["lease_id"], str(wanted.get("op_id") or "")
        key = f"restore:{lease_id}"
        if not op_id or self.journal.is_done(op_id):
            return
        job = self.jobs.get(key)
        if job is not None and job.op_id == op_id and job.state == "done":
            self._evidence("snapshot_restored", lease_id, op_id,
                           {"snapshot_id": wanted.get("snapshot_id"), **job.result})
            self.journal.done(lease_id, op_id, snapshot_id=wanted.get("snapshot_id"))
            self.jobs.forget(key)
            return
        if job is not None and job.op_id == op_id and (job.state == "running" or not self.jobs.due_again(key)):
            return
        job = Job("restore", op_id)
        try:
            if self.runtime.status(lease_id).state not in ("stopped", "absent"):
                raise OperationFailed("snapshot_restore_failed", f"lease {lease_id}'s instance runs: a snapshot "
                                      "is restored into an existing disk only while the instance is stopped")
            repo = Repository.from_desired(wanted.get("repository"))
            restic_snapshot = str(wanted.get("restic_snapshot") or "")
            if not restic_snapshot:
                raise OperationFailed("bad_desired_state", "restore needs restic_snapshot")
            target = self.disks.ensure_ready(lease_id, int(item["disk_gb"]))
        except (OperationFailed, KeyError, TypeError, ValueError) as exc:
            code, detail = (exc.code, exc.detail) if isinstance(exc, OperationFailed) else ("bad_desired_state",
                                                                                            repr(exc))
            job.state, job.error, job.ended = "failed", (code, detail), time.monotonic()
            self.jobs.put(key, job)
            return
        log.info("lease %s: restore %s into its existing disk starting", lease_id, op_id)
        self.jobs.start(key, job, lambda job: restore_snapshot(job, repo=repo, restic_snapshot=restic_snapshot,
                                                               target=target, replace=True))

    def _with_volumes(self, item: dict, report: dict) -> dict:
        """Every pass, whatever the op: the running lease's volumes mounted as listed (an
        attach or detach does not change the op_id); a failed mount is a named failure."""
        if self.volumes is None or item.get("want") != "running" or report.get("state") != "running":
            return report
        wanted = item.get("volumes") if isinstance(item.get("volumes"), list) else []
        if not wanted and not self.volumes.lease_dir(item["lease_id"]).is_dir():
            return report
        from .volumes import Access

        access = Access.from_desired(self.storage)
        if access is not None and not access.key:
            access = None
        try:
            report["volumes"] = self.volumes.sync(item["lease_id"], wanted, access)
        except OperationFailed as exc:
            report["volumes"] = [{"volume_id": w.get("volume_id"), "mounted": False,
                                  "error": {"code": exc.code, "detail": exc.detail}} for w in wanted]
        failed = [v["error"] for v in report["volumes"] if v.get("error")]
        if failed and not report.get("error"):
            report["error"] = failed[0]
        return report

    def _once(self, lease_id: int, op_id: str, kind: str, step) -> None:
        """Key destruction and wipe happen once per lease, whatever op asks again."""
        marker = f"lease:{lease_id}:{kind}"
        if self.journal.is_done(marker):
            return
        evidence: DiskEvidence = step(lease_id)
        details = dict(evidence.details)
        if kind == "key_destroyed" and self.gpu_memory is not None:
            # the release's record: every GPU the lease used here, cleared or not (PROTOCOL.md)
            details["gpu_memory_cleared"] = self.gpu_memory.results(lease_id)
        self._evidence(kind, lease_id, op_id, {
            **details,
            "commands": [{"argv": c.argv, "exit": c.exit} for c in evidence.commands]})
        self.journal.done(lease_id, marker)

    def _evidence(self, kind: str, lease_id: int, op_id: str, facts: dict) -> None:
        record = {**facts, "kind": kind, "node": self.node, "lease_id": lease_id,
                  "op_id": op_id, "at": utc_now()}
        self.outbox.add(self.key.sign_record(record))

    def _instance_image(self, item: dict) -> tuple[str, bool]:
        """(local reference, whether it is the customer's own `image_ref`): the item's
        `image_ref` when it has one (validated), else its slug through [images]."""
        ref = item.get("image_ref")
        if ref:
            return normalise_reference(ref), True
        return self._image_ref(item["image"]), False

    def _pull_progress(self, item: dict) -> dict | None:
        progress = getattr(self.runtime, "pull_progress", None)
        if progress is None:
            return None
        try:
            return progress(self._instance_image(item)[0])
        except (OperationFailed, KeyError, TypeError):
            return None

    def _image_ref(self, slug: str) -> str:
        if slug not in self.images:
            raise OperationFailed("image_missing",
                                  f"no local image configured for {slug!r} ([images] in config)")
        return self.images[slug]

    def _gpus_in_use(self, *, but: int) -> dict[str, int]:
        """GPUs another listed lease's instance runs on now (uuid -> that lease)."""
        by_index = {g.index: g.uuid for g in self._gpus}
        taken = {}
        for item in self._listed:
            if item["lease_id"] == but or item.get("want") != "running":
                continue
            uuids = [by_index[s] for s in item.get("gpus") or [] if s in by_index]
            if uuids and self._safe_status(item["lease_id"]).state == "running":
                taken.update((uuid, item["lease_id"]) for uuid in uuids)
        return taken

    @staticmethod
    def _gpu_uuids(slots: list[int], gpus: list[GpuInfo]) -> tuple[str, ...]:
        by_index = {g.index: g.uuid for g in gpus}
        missing = [s for s in slots if s not in by_index]
        if missing:
            raise OperationFailed("gpu_missing",
                                  f"GPU slot(s) {missing} not found by NVML on this node")
        return tuple(by_index[s] for s in slots)

    # -- reporting -----------------------------------------------------------------------
    def _report(self, lease_id: int, op_id: str, status: InstanceStatus) -> dict:
        """`op_id` "" for an instance the storefront no longer lists (nothing was asked)."""
        return {"lease_id": lease_id, "op_id": op_id, "state": status.state,
                "ssh_port": status.ssh_port, "egress_bytes": status.egress_bytes,
                "error": self.journal.error_for(lease_id, op_id) if op_id else None,
                # container port -> the host port it is published on (its address)
                "ports": {str(port): host for port, host in status.ports}}

    def _safe_status(self, lease_id: int) -> InstanceStatus:
        try:
            return self.runtime.status(lease_id)
        except OperationFailed:
            return InstanceStatus(lease_id=lease_id, state="failed")

    def _runtime_leases(self) -> list[int]:
        try:
            return self.runtime.lease_ids()
        except OperationFailed as exc:
            log.warning("cannot list instances: %s", exc)
            return []


def _workbench_digest(item: dict) -> str:
    """What of an item's workbench needs a new container when it changes, as a short digest
    for the journal: the environment holds secrets, never written to the state directory in
    clear (the container's spec-hash label holds the same digest already)."""
    fields = {name: item.get(name) for name in ("image", "image_ref", "start_command", "env")}
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _workbench_fact(item: dict, status: InstanceStatus) -> dict:
    return {"workbench": _workbench_digest(item)} if status.state == "running" else {}


def _satisfied(want: str | None, state: str) -> bool:
    """Whether the observed state is what was asked (a never-created instance is stopped)."""
    return state == want or (want == "stopped" and state == "absent")


def _well_formed(item) -> bool:
    """An item without a lease id and op id cannot even be reported on: skip it."""
    if isinstance(item, dict) and type(item.get("lease_id")) is int and \
            isinstance(item.get("op_id"), str) and item["op_id"]:
        return True
    log.error("ignoring a malformed desired-state item: %.200r", item)
    return False
