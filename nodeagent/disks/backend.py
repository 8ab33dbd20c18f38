"""LuksDisks: the `Disks` backend. Each lease gets its own carved block device, LUKS2
with its own random key, ext4, mounted for the instance; at the end its key is destroyed
with proof and its blocks are sanitized with a verified, signed-ready record."""
import datetime as dt
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from nodeagent.interfaces import DiskEvidence, OperationFailed

from . import luks, wipe
from .carvers import Carver
from .keystore import KeyStore, forget
from .mounts import HOST_MOUNTINFO, mounted_from
from .nvme import SCOPE_SHARED, choose_method
from .runner import Runner
from .state import LeaseDisk, StateDir, evidence_from_dict, evidence_to_dict

VERIFY_SAMPLES = 3000     # 95 % confidence of finding a residue on 0.1 % of the blocks


def utc_now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def mapping_name(lease_id: int) -> str:
    return f"gpu-lease-{int(lease_id)}"


@dataclass
class LuksDisks:
    carver: Carver
    keys: KeyStore
    state: StateDir
    mount_root: Path
    runner: Runner
    verify_samples: int = VERIFY_SAMPLES
    before_verify: Callable[[str], None] | None = None     # test seam between wipe and read-back
    host_mountinfo: Path = HOST_MOUNTINFO                   # dockerd's view of the mounts

    # -- while the lease lives -------------------------------------------------------

    def ensure_ready(self, lease_id: int, size_gb: int) -> str:
        """Carve, LUKS-format (once), open, mkfs (once), mount; returns the mount path."""
        disk = self.provision(lease_id, size_gb)
        key = self.keys.load(lease_id)
        try:
            mapped = luks.luks_open(self.runner, disk.device, mapping_name(lease_id), key)
        finally:
            forget(key)
        self._ensure_filesystem(disk, mapped)
        return self._ensure_mounted(lease_id, mapped)

    def is_ready(self, lease_id: int) -> bool:
        """The lease's volume is open and mounted at its mount point in the host's mount
        namespace, where dockerd binds it: the one condition for starting its container."""
        return mounted_from(self.mountpoint(lease_id), luks.mapper_path(mapping_name(lease_id)),
                            self.host_mountinfo)

    def mount_path(self, lease_id: int) -> str:
        """Where the lease's file system is mounted (what a snapshot copies: files, never
        the LUKS header or key)."""
        return str(self.mountpoint(lease_id))

    def mountpoint(self, lease_id: int) -> Path:
        return self.mount_root / mapping_name(lease_id)

    def provision(self, lease_id: int, size_gb: int) -> LeaseDisk:
        """Carve the lease's device and give it a LUKS2 header with a fresh key (once)."""
        disk = self.state.load(lease_id) or LeaseDisk(lease_id)
        if disk.wiped:
            # The lease moved off this node, the copy it left here was wiped and its device
            # returned to the pool (its proofs went to the storefront), and it is back: a new
            # disk. Nothing of the old one is readable, so nothing can be exposed by this.
            disk = LeaseDisk(lease_id)
        if disk.key_destroyed:
            raise OperationFailed("disk_error", f"the key of lease {lease_id}'s disk was destroyed")
        carve = self.carver.ensure(self.runner, lease_id, size_gb)
        disk.device, disk.scope = carve.device, carve.scope
        self.state.save(disk)
        self._ensure_formatted(disk)
        return disk

    def detach(self, lease_id: int) -> None:
        self._unmount(self.runner, lease_id)
        luks.luks_close(self.runner, mapping_name(lease_id))

    def _ensure_formatted(self, disk: LeaseDisk) -> None:
        if disk.luks_uuid:
            if not luks.is_luks(self.runner, disk.device):
                raise OperationFailed("disk_error", f"{disk.device} lost its LUKS header "
                                      f"(expected {disk.luks_uuid}); not reformatting customer data")
            return
        if luks.is_luks(self.runner, disk.device):
            if self._stored_key_opens(disk):          # a crash right after luksFormat
                disk.luks_uuid = luks.luks_uuid(self.runner, disk.device)
                self.state.save(disk)
                return
            raise OperationFailed("disk_error", f"{disk.device} already holds a LUKS volume this "
                                  "lease never made; refusing to format over it")
        key = self.keys.new_key(disk.lease_id)        # stored wrapped before first use
        try:
            disk.luks_uuid = luks.luks_format(self.runner, disk.device, key, mapping_name(disk.lease_id))
        finally:
            forget(key)
        self.state.save(disk)

    def _stored_key_opens(self, disk: LeaseDisk) -> bool:
        if not self.keys.has_key(disk.lease_id):
            return False
        key = self.keys.load(disk.lease_id)
        try:
            return luks.test_passphrase_exit(self.runner, disk.device, key) == 0
        finally:
            forget(key)

    def _ensure_filesystem(self, disk: LeaseDisk, mapped: str) -> None:
        probe = self.runner.run(["blkid", "-p", "-o", "value", "-s", "TYPE", mapped], check=False)
        if probe.exit == 0 and probe.stdout.strip():
            return
        if disk.filesystem_made:
            raise OperationFailed("disk_error", f"the filesystem on {mapped} vanished; not recreating it")
        self.runner.run(["mkfs.ext4", "-q", "-E", "nodiscard", "-L", mapping_name(disk.lease_id), mapped])
        disk.filesystem_made = True
        self.state.save(disk)

    def _ensure_mounted(self, lease_id: int, mapped: str) -> str:
        mountpoint = self.mountpoint(lease_id)
        mountpoint.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not _is_mountpoint(mountpoint):
            self.runner.run(["mount", "-t", "ext4", "-o", "nodev,nosuid", mapped, str(mountpoint)])
        if not self.is_ready(lease_id):
            raise OperationFailed("disk_not_mounted", f"{mapped} is mounted at {mountpoint} for the "
                                  f"agent but not in the host's view ({self.host_mountinfo}): the "
                                  "agent runs in a private mount namespace, dockerd would bind the "
                                  "unencrypted directory underneath")
        return str(mountpoint)

    def _unmount(self, runner: Runner, lease_id: int) -> None:
        mountpoint = self.mountpoint(lease_id)
        if _is_mountpoint(mountpoint):
            runner.run(["umount", str(mountpoint)])

    # -- key destruction ----------------------------------------------------------------

    def destroy_key(self, lease_id: int) -> DiskEvidence:
        """Close, erase every keyslot, prove the old key no longer opens the header and no
        keyslot is left, then shred the stored key. A second call returns the same proof;
        a failed proof raises and nothing is recorded as destroyed (the key is kept so the
        retry can prove it)."""
        disk = self._known(lease_id)
        if disk.key_destroyed:
            return evidence_from_dict(disk.key_destroyed)
        rec = self.runner.recording()
        self._unmount(rec, lease_id)
        luks.luks_close(rec, mapping_name(lease_id))
        key = self.keys.load(lease_id)
        try:
            luks.luks_erase(rec, disk.device)
            test_exit = luks.test_passphrase_exit(rec, disk.device, key)
            slots = luks.keyslot_count(rec, disk.device)
        finally:
            forget(key)
        if test_exit == 0 or slots != 0:
            raise OperationFailed("key_destroy_failed", f"{disk.device}: old key test exit {test_exit}, "
                                  f"{slots} keyslot(s) left after luksErase")
        evidence = DiskEvidence(details={"device": disk.device, "luks_uuid": disk.luks_uuid,
                                         "test_passphrase_exit": test_exit, "keyslots_after": slots,
                                         "destroyed_at": utc_now()},
                                commands=list(rec.commands))
        disk.key_destroyed = evidence_to_dict(evidence)
        self.state.save(disk)                   # proof first: a crash now leaves a spare blob
        self.keys.shred(lease_id)
        return evidence

    # -- wipe -------------------------------------------------------------------------

    def wipe(self, lease_id: int) -> DiskEvidence:
        """Sanitize the lease's blocks with the strongest method that spares neighbours and
        verify by sampled read-back. Runs destroy_key first (idempotent). A wipe that
        passed returns its stored record; a failed one returns `result: failed` (the
        storefront quarantines the node) and is attempted again on the next call."""
        disk = self._known(lease_id)
        if disk.wiped:
            return evidence_from_dict(disk.wiped)
        key_proof = self.destroy_key(lease_id)
        disk = self._known(lease_id)                # now carrying the key proof
        rec = self.runner.recording()
        started = utc_now()
        ident = wipe.identify(rec, disk.device)
        method = choose_method(ident.caps, disk.scope or SCOPE_SHARED)
        details = {"device": disk.device, "scope": disk.scope, "device_model": ident.model,
                   "device_serial": ident.serial, "firmware": ident.firmware,
                   "identity_source": ident.source, "method": method,
                   "nist_category": "purge", "nist_basis": _nist_basis(method),
                   "luks_uuid": key_proof.details["luks_uuid"], "started_at": started}
        if ident.caps:
            details["capabilities"] = {"sanicap": ident.caps.sanicap, "fna": ident.caps.fna,
                                       "oacs": ident.caps.oacs}
        error = self._run_method(rec, method, disk.device, details)
        if self.before_verify:
            self.before_verify(disk.device)
        details["verification"] = wipe.verify_zero(disk.device, self.verify_samples)
        details["finished_at"] = utc_now()
        details["sanitization"] = _sanitization_fields(details, rec)
        ok = error is None and details["verification"]["nonzero"] == 0
        details["result"] = "ok" if ok else "failed"
        if error:
            details["error"] = error
        evidence = DiskEvidence(details=details, commands=list(rec.commands))
        if ok:
            disk.wiped = evidence_to_dict(evidence)
            self.state.save(disk)
            self.carver.release(self.runner, lease_id)
        return evidence

    @staticmethod
    def _run_method(rec: Runner, method: str, device: str, details: dict) -> str | None:
        try:
            if method == "sanitize-crypto":
                details.update(wipe.sanitize(rec, device, 4))
            elif method == "sanitize-block":
                details.update(wipe.sanitize(rec, device, 2))
            elif method in ("format-ses2", "format-ses1"):
                details.update(wipe.format_namespace(rec, device, int(method[-1])))
            else:
                details.update(wipe.discard_and_overwrite(rec, device))
        except OperationFailed as exc:
            return exc.detail
        return None

    def _known(self, lease_id: int) -> LeaseDisk:
        disk = self.state.load(lease_id)
        if disk is None or not disk.luks_uuid:
            raise OperationFailed("disk_unknown", f"lease {lease_id} has no encrypted disk on this node")
        return disk


def _sanitization_fields(details: dict, rec: Runner) -> dict:
    """The fields NIST SP 800-88 Rev. 2 (its sanitization record) and ISO/IEC 27040 ask
    for: method, technique, tool and version, verification, who performed it, the medium
    and the date. The node that performed it is the record's signed `node`."""
    from nodeagent import __version__

    verification = details["verification"]
    return {"standards": "NIST SP 800-88 Rev. 2; ISO/IEC 27040:2024",
            "method": details["nist_category"], "technique": details["method"],
            "technique_basis": details["nist_basis"],
            "tool": "gpu-node-agent", "tool_version": __version__,
            "commands": sorted({c.argv[0] for c in rec.commands if c.argv}),
            "verification": f"sampled read-back with O_DIRECT of {verification['samples']} blocks "
                            f"({verification['confidence']['statement']})",
            "performed_by": "the node agent of the node that signed this record (automated; no operator "
                            "handles the medium)",
            "medium": {"type": "NVMe namespace" if details.get("capabilities") else "block device",
                       "model": details["device_model"], "serial": details["device_serial"],
                       "firmware": details["firmware"], "scope": details["scope"]},
            "date": details["finished_at"]}


def _nist_basis(method: str) -> str:
    if method.startswith("sanitize-"):
        return "NVMe Sanitize (SP 800-88 Purge for NVMe media)"
    if method.startswith("format-"):
        return "NVMe Format with Secure Erase Settings (SP 800-88 Purge for NVMe media)"
    return ("cryptographic erase: the data was only ever written LUKS2-encrypted and every "
            "keyslot holding its volume key was erased (key_destroyed), then the range was "
            "discarded and overwritten with zeros")


def _is_mountpoint(path: Path) -> bool:
    return os.path.ismount(path)
