"""Wipe methods, the device identity for the sanitization record, and the sampled
read-back verification."""
import hashlib
import math
import mmap
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from nodeagent.interfaces import OperationFailed

from .carvers import nvme_controller
from .nvme import (
    SANITIZE_DONE,
    SANITIZE_DONE_NO_DEALLOC,
    SANITIZE_FAILED,
    NvmeCapabilities,
    sanitize_status,
)
from .runner import Runner

BLOCK = 4096
LUKS2_HEADER_BYTES = 16 * 1024 * 1024     # where the keyslots were: always sampled
ZERO_BLOCK = bytes(BLOCK)


@dataclass(frozen=True)
class Identity:
    model: str
    serial: str
    firmware: str
    source: str                          # nvme id-ctrl | sysfs
    caps: NvmeCapabilities | None        # only for a device that is an NVMe namespace


def identify(runner: Runner, device: str) -> Identity:
    """Model/serial/firmware of the physical drive under `device` (an LV, a partition,
    a namespace, a loop device) and, when `device` is itself a namespace, its NVMe
    capabilities (an LV or a partition never gets drive-wide commands)."""
    own_controller = nvme_controller(os.path.realpath(device))
    disk = backing_disk(device)
    controller = own_controller or nvme_controller(f"/dev/{disk}")
    if controller:
        ctrl = runner.run(["nvme", "id-ctrl", controller, "-o", "json"], check=False)
        if ctrl.exit == 0:
            caps = NvmeCapabilities.from_id_ctrl(ctrl.stdout)
            return Identity(caps.model, caps.serial, caps.firmware, "nvme id-ctrl",
                            caps if own_controller else None)
    attrs = Path("/sys/class/block", disk, "device")
    model = _read(attrs / "model") or ("Linux loop device" if disk.startswith("loop") else "unknown")
    return Identity(model, _read(attrs / "serial"), _read(attrs / "firmware_rev") or _read(attrs / "rev"),
                    "sysfs", None)


def backing_disk(device: str) -> str:
    """Kernel name of the disk under `device`, following device-mapper slaves (LV, dm-crypt)
    and partition parents in sysfs, which needs no udev."""
    name = sysfs_name(device)
    while True:
        node = Path("/sys/class/block", name)
        slaves = sorted(os.listdir(node / "slaves")) if (node / "slaves").is_dir() else []
        if slaves:
            name = slaves[0]
        elif (node / "partition").exists():
            name = Path(os.path.realpath(node)).parent.name
        else:
            return name


def sysfs_name(device: str) -> str:
    """Kernel name of a block device, by device number (without udev, /dev/mapper and LV
    paths are plain nodes, not symlinks to /dev/dm-N)."""
    rdev = os.stat(device).st_rdev
    return Path(os.path.realpath(f"/sys/dev/block/{os.major(rdev)}:{os.minor(rdev)}")).name


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def discard_supported(device: str) -> bool:
    try:
        with open(f"/sys/class/block/{sysfs_name(device)}/queue/discard_max_bytes") as f:
            return int(f.read()) > 0
    except (OSError, ValueError):
        return False


def discard_and_overwrite(runner: Runner, device: str) -> dict:
    """Discard the device's range (when the device supports it) so the FTL drops the
    mappings, then overwrite it with zeros so what is read back is defined."""
    supported = discard_supported(device)
    if supported:
        runner.run(["blkdiscard", "--force", device], code="wipe_failed")
    runner.run(["blkdiscard", "--zeroout", "--force", device], code="wipe_failed")
    return {"discard_supported": supported, "overwrite": "zero"}


def format_namespace(runner: Runner, device: str, ses: int) -> dict:
    if ses not in (1, 2):                     # SES=0 erases nothing: never
        raise ValueError("a format without secure erase is not a wipe")
    runner.run(["nvme", "format", device, f"--ses={ses}", "--force"], code="wipe_failed")
    return {"ses": ses}


def sanitize(runner: Runner, device: str, action: int, *, poll_s: float = 5.0,
             timeout_s: float = 24 * 3600) -> dict:
    """Start a sanitize (2 block erase, 4 crypto erase) on the drive's controller and poll
    its sanitize log until it completes; a failed sanitize raises."""
    controller = nvme_controller(os.path.realpath(device))
    if controller is None:
        raise OperationFailed("wipe_failed", f"{device} is not an NVMe namespace")
    runner.run(["nvme", "sanitize", controller, f"--sanact={action}"], code="wipe_failed")
    deadline, polls = time.monotonic() + timeout_s, 0
    while time.monotonic() < deadline:
        status, progress = sanitize_status(
            runner.run(["nvme", "sanitize-log", controller, "-o", "json"], code="wipe_failed").stdout)
        polls += 1
        if status in (SANITIZE_DONE, SANITIZE_DONE_NO_DEALLOC):
            return {"sanact": action, "sanitize_status": status, "polls": polls}
        if status == SANITIZE_FAILED:
            raise OperationFailed("wipe_failed", f"sanitize of {controller} reported failure")
        time.sleep(poll_s)
    raise OperationFailed("wipe_failed", f"sanitize of {controller} did not finish in {timeout_s}s")


def fixed_offsets(size: int) -> list[int]:
    """The blocks always read: the first, the end of the old LUKS2 keyslot area, the last."""
    last = size // BLOCK - 1
    return sorted(block * BLOCK for block in {0, min(LUKS2_HEADER_BYTES // BLOCK - 1, last), last})


CONFIDENCE = 0.95


def sample_confidence(random_samples: int, *, blocks: int) -> dict:
    """What `random_samples` distinct uniformly random blocks prove: a residue left on a
    fraction p of the blocks escapes all of them with probability at most (1 - p)^n (less
    without replacement), so p >= 1 - (1 - CONFIDENCE)^(1/n) is found with that confidence.
    Every block read: the whole disk is proven."""
    if random_samples >= blocks - 3:
        return {"level": 1.0, "random_samples": random_samples, "min_fraction": 0.0,
                "statement": "every block of the disk was read back"}
    if random_samples <= 0:
        return {"level": 0.0, "random_samples": 0, "min_fraction": 1.0,
                "statement": "no random block was read back: nothing is stated"}
    # rounded up: a claim about a smaller residue would overstate what was proven
    fraction = math.ceil((1 - math.exp(math.log(1 - CONFIDENCE) / random_samples)) * 1e6) / 1e6
    return {"level": CONFIDENCE, "random_samples": random_samples, "min_fraction": fraction,
            "statement": f"a residue on {fraction:.3%} or more of the disk's blocks would have been "
                         f"found with {CONFIDENCE:.0%} confidence ({random_samples} random blocks)"}


def sample_offsets(size: int, samples: int) -> list[int]:
    """`samples` block offsets: the first block and the end of the old LUKS2 keyslot area
    (where the header was), the last block, and random blocks in between."""
    last = size // BLOCK - 1
    fixed = {0, min(LUKS2_HEADER_BYTES // BLOCK - 1, last), last}
    rng = secrets.SystemRandom()
    chosen = set(fixed)
    while len(chosen) < min(samples, last + 1):
        chosen.add(rng.randint(0, last))
    return sorted(block * BLOCK for block in chosen)


def device_size(device: str) -> int:
    fd = os.open(device, os.O_RDONLY)
    try:
        return os.lseek(fd, 0, os.SEEK_END)
    finally:
        os.close(fd)


def verify_zero(device: str, samples: int) -> dict:
    """Read `samples` blocks with O_DIRECT (the media, not the page cache); all must be zero.
    A block that cannot be read is not proven zero: it counts as nonzero and is listed
    with its error, so the wipe fails with evidence instead of crashing the operation."""
    offsets = sample_offsets(device_size(device), samples)
    buf = mmap.mmap(-1, BLOCK)                 # page-aligned, as O_DIRECT requires
    nonzero, unreadable = [], {}
    fd = os.open(device, os.O_RDONLY | os.O_DIRECT)
    try:
        for offset in offsets:
            try:
                complete = os.preadv(fd, [buf], offset) == BLOCK
            except OSError as exc:
                unreadable[offset] = exc.strerror or repr(exc)
                complete = False
            if not complete or buf[:] != ZERO_BLOCK:
                nonzero.append(offset)
    finally:
        os.close(fd)
        buf.close()
    size = device_size(device)
    fixed = fixed_offsets(size)
    listed = sorted(set(fixed) | set(nonzero))     # all of them: too long for a report
    result = {"samples": len(offsets), "nonzero": len(nonzero), "pattern": "zero",
              "block_bytes": BLOCK, "offsets": [o for o in offsets if o in listed],
              "offsets_sha256": hashlib.sha256(",".join(map(str, offsets)).encode()).hexdigest(),
              "nonzero_offsets": nonzero,
              "confidence": sample_confidence(len(offsets) - len(fixed), blocks=size // BLOCK)}
    if unreadable:
        result["unreadable_offsets"] = {str(offset): error for offset, error in unreadable.items()}
    return result
