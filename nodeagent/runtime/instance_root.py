"""Every byte an instance writes lands on its lease's encrypted disk.

`/workspace` is the lease's disk itself. The rest of what a tenant can write — the
container's root file system (`/root` with its pip and Hugging Face caches, `/tmp`,
`/var/tmp`, `/opt`, `/home`, site-packages, whatever apt installs) and the three files
Docker binds into `/etc` — would otherwise live in dockerd's data root on the node's OS
disk, in plaintext, and outlive the lease (docs/adr/0003-instance-root-on-the-lease-disk.md).

So, on the lease's disk, in `INSTANCE_ROOT` (hidden from the instance behind an empty
read-only mount):

- the container's overlay2 writable layer: its `diff` (the overlay's upper directory)
  and `work` directories. Docker creates both at `create`, empty, under
  `<data root>/overlay2/<layer>/`; before the container first starts they are replaced
  by symbolic links to directories on the lease's disk, which the kernel follows when
  dockerd mounts the overlay. The layer then shares the lease's disk size (no separate
  writable-layer quota, no XFS `pquota` needed), and when the disk is not mounted the
  links point into the bare mount point, where the directories do not exist: the
  overlay mount fails and the instance does not start, rather than write in plaintext;
- `/etc/hostname`, `/etc/hosts` and `/etc/resolv.conf`, bound from files the agent writes
  there (Docker then keeps none of its own, which it writes under `<data root>/containers`).

Container logs are not kept (log driver `none`); `/dev/shm` is RAM.
"""
import os
import shutil
from pathlib import Path

from ..interfaces import OperationFailed

INSTANCE_ROOT = ".instance-root"       # on the lease's disk; masked inside the instance
LAYER_DIRS = ("diff", "work")          # overlay2's upper and work directories
ETC_FILES = ("hostname", "hosts", "resolv.conf")
# What Docker itself writes for a container on a user-defined network: its embedded DNS
# server, which forwards to the daemon's `dns` servers (docker-daemon.json).
RESOLV_CONF = "nameserver 127.0.0.11\noptions ndots:0\n"


def instance_root(disk_path: str) -> Path:
    return Path(disk_path) / INSTANCE_ROOT


def etc_binds(disk_path: str, hostname: str, owner: int) -> dict[str, dict]:
    """Docker `volumes` entries for the /etc files, written on the lease's disk first
    (a missing bind source would be made a directory by dockerd) and owned by container
    root (`owner`, a host uid under userns-remap) so the tenant edits them as on any
    machine. Existing files are kept: a tenant's own /etc/hosts entries survive a
    restart."""
    etc = instance_root(disk_path) / "etc"
    etc.mkdir(parents=True, exist_ok=True)
    _searchable(instance_root(disk_path))
    _searchable(etc)
    defaults = {"hostname": f"{hostname}\n",
                "hosts": (f"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
                          f"127.0.1.1\t{hostname}\n"),
                "resolv.conf": RESOLV_CONF}
    binds = {}
    for name in ETC_FILES:
        path = etc / name
        if not path.exists():
            path.write_text(defaults[name])
            path.chmod(0o644)
            os.chown(path, owner, owner)
        binds[str(path)] = {"bind": f"/etc/{name}", "mode": "rw"}
    return binds


def place_layer(upper_dir: str, disk_path: str, container_id: str) -> list[str]:
    """Make the container's overlay2 `diff` and `work` links to directories on the lease's
    disk (idempotent). Returns what changed, for the log. Refuses a layer that already
    holds files on the node's disk: they were written in plaintext by a container that
    ran before (an older agent), and are not moved silently."""
    layer = Path(upper_dir).parent
    home = instance_root(disk_path) / "layers" / container_id
    if layer_on_disk(upper_dir, disk_path, container_id):
        if not all((home / name).is_dir() for name in LAYER_DIRS):
            # never made again here: this is a bare mount point (the disk not mounted),
            # where the instance would write in plaintext
            raise OperationFailed("disk_not_mounted", f"{home} is missing: the lease's disk "
                                  "is not mounted; not starting")
        return []
    home.mkdir(parents=True, exist_ok=True)
    _searchable(instance_root(disk_path))
    os.chmod(home.parent, 0o700)     # overlayfs reaches it with dockerd's credentials
    changed = []
    for name in LAYER_DIRS:
        link, target = layer / name, home / name
        if link.is_symlink() or not link.is_dir():
            # a link elsewhere (another disk path) or nothing: not what dockerd made, and
            # the tenant's files are not here to move
            raise OperationFailed("runtime_error", f"{link} is not the directory dockerd "
                                  "made: the container must be recreated")
        if any(link.iterdir()) and name == "diff":
            raise OperationFailed("runtime_error", f"{link} already holds files on the node's "
                                  "disk: the container must be recreated")
        st = os.stat(link)
        if not target.is_dir():
            _make_like(target, st, mode=st.st_mode & 0o7777)
        shutil.rmtree(link)
        os.symlink(target, link)
        changed.append(name)
    return changed


def layer_on_disk(upper_dir: str, disk_path: str, container_id: str) -> bool:
    """Whether both overlay2 directories are links to this lease's disk."""
    layer = Path(upper_dir).parent
    home = instance_root(disk_path) / "layers" / container_id
    return all((layer / name).is_symlink() and os.readlink(layer / name) == str(home / name)
               for name in LAYER_DIRS)


def forget_other_layers(disk_path: str, keep: str | None) -> list[str]:
    """Remove the writable layers of containers this lease no longer has (a container
    recreated for a new specification starts from the image again)."""
    layers = instance_root(disk_path) / "layers"
    removed = []
    if layers.is_dir():
        for entry in layers.iterdir():
            if entry.name != keep:
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(entry.name)
    return removed


def _make_like(path: Path, st: os.stat_result, *, mode: int) -> None:
    """A directory owned as dockerd made the original (container root under userns-remap)."""
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, st.st_uid, st.st_gid)
    path.chmod(mode)


def _searchable(path: Path) -> None:
    """Search only for others: under userns-remap runc binds the /etc files from inside
    the container's user namespace, as an unprivileged host uid that must pass through;
    nobody but root lists what is here."""
    os.chmod(path, 0o711)
