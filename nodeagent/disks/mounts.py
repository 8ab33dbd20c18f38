"""Where dockerd sees a lease's disk. dockerd runs in the host's mount namespace (PID 1's)
and bind-mounts the lease's mount point into the container when it starts it. A volume
mounted in a private mount namespace of the agent (systemd's PrivateTmp=, ProtectHome=,
ProtectSystem=, … or `unshare --mount`) is invisible there: dockerd would bind the plain
directory underneath, on the node's root filesystem, unencrypted.

So the agent checks the host's view, `/proc/1/mountinfo`, not its own: it refuses to run
the LUKS backend from a private mount namespace, and a container is started only while
the host's view shows the lease's opened volume mounted at its mount point."""
import os
from dataclasses import dataclass
from pathlib import Path

HOST_MOUNTINFO = Path("/proc/1/mountinfo")
OWN_MOUNTINFO = Path("/proc/self/mountinfo")


@dataclass(frozen=True)
class Mount:
    mount_id: str
    device: str          # "major:minor"
    mountpoint: str
    source: str


def read_mounts(mountinfo: Path) -> list[Mount]:
    """The entries of a mountinfo file (proc(5)), in mount order."""
    mounts = []
    for line in Path(mountinfo).read_text().splitlines():
        fields = line.split()
        if len(fields) < 7 or "-" not in fields[6:]:
            continue
        tail = fields[fields.index("-", 6) + 1:]
        mounts.append(Mount(mount_id=fields[0], device=fields[2],
                            mountpoint=_unescape(fields[4]),
                            source=_unescape(tail[1]) if len(tail) > 1 else ""))
    return mounts


def shares_host_namespace(host: Path = HOST_MOUNTINFO, own: Path = OWN_MOUNTINFO) -> bool:
    """Whether this process sees the host's mount table. A new mount namespace copies
    every mount with a fresh mount id, so the ids of `/` differ (this needs no ptrace
    access to PID 1, unlike comparing /proc/1/ns/mnt)."""
    return _root_id(host) == _root_id(own)


def mounted_from(mountpoint: str | Path, device_path: str | Path,
                 mountinfo: Path = HOST_MOUNTINFO) -> bool:
    """Whether `mountinfo`'s view has `device_path` (a block device) as the topmost mount
    at `mountpoint`: what a process in that namespace (dockerd) finds there."""
    try:
        rdev = os.stat(device_path).st_rdev
    except OSError:
        return False
    wanted = f"{os.major(rdev)}:{os.minor(rdev)}"
    top = [m for m in read_mounts(mountinfo) if m.mountpoint == os.path.normpath(mountpoint)]
    return bool(top) and top[-1].device == wanted


def _root_id(mountinfo: Path) -> str | None:
    roots = [m.mount_id for m in read_mounts(mountinfo) if m.mountpoint == "/"]
    return roots[-1] if roots else None


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes (\\040…)."""
    for code in ("\\040", "\\011", "\\012", "\\134"):
        field = field.replace(code, chr(int(code[1:], 8)))
    return field
