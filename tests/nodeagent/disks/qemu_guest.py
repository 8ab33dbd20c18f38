"""Builds and boots a minimal QEMU guest (TCG, no KVM) that runs the real disk backend
against an emulated NVMe drive: the dm-crypt open/mkfs/mount path and `nvme format` that
the CI host kernel cannot do (no device-mapper, no NVMe driver).

- kernel: vmlinuz and the needed modules from Debian's linux-image-amd64 package
  (downloaded with `apt-get download`, never installed on the host);
- initramfs: busybox-static, cryptsetup, nvme-cli, e2fsprogs, util-linux tools and their
  shared libraries (ldd), this Python interpreter with only the modules the guest script
  imports, nodeagent/ and guest_steps.py; /init runs guest_steps.py and powers off.
The kernel/tools layer is cached under /var/cache/gpu-storefront-tests/; the Python layer
is rebuilt per run (it carries the code under test) and appended as a second cpio."""
import fcntl
import hashlib
import importlib.util
import os
import re
import shutil
import stat
import subprocess
import sys
import sysconfig
from contextlib import contextmanager
from pathlib import Path

CACHE = Path(os.environ.get("GPU_STOREFRONT_TEST_CACHE", "/var/cache/gpu-storefront-tests"))
REPO = Path(__file__).resolve().parents[3]
GUEST_SCRIPT = Path(__file__).with_name("guest_steps.py")
MODULES = ["nvme", "dm-crypt", "ext4", "ecb", "xts", "algif_skcipher", "crc32c_generic", "dm-mod"]
TOOLS = ["cryptsetup", "nvme", "mke2fs", "blkid", "blkdiscard", "lsblk", "blockdev", "dmsetup", "lvm"]
LVM_COMMANDS = ["lvcreate", "lvs", "lvremove", "pvcreate", "vgcreate"]
# No udev in the guest: LVM and libdevmapper create the device nodes themselves.
LVM_CONF = """devices { obtain_device_list_from_udev = 0 }
activation { udev_sync = 0 udev_rules = 0 monitoring = 0 }
"""
INIT = """#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
mkdir -p /run /tmp /srv /state; mount -t tmpfs run /run; mkdir -p /run/lock/lvm
export DM_DISABLE_UDEV=1
echo "GUEST-INIT $(cat /proc/uptime)"
# TCG on a busy CI host can stall one NVMe command past the default 30 s; the guest
# kernel would then abort it and fail the read with EIO, which is the host's load, not ours.
for m in $(cat /modules.order); do
  case "$m" in */nvme-core.ko) opts="io_timeout=600 admin_timeout=600";; *) opts="";; esac
  insmod "/lib/modules/$m" $opts || echo "GUEST-INSMOD-FAILED $m"
done
for i in $(seq 100); do [ -b /dev/nvme0n1 ] && [ -b /dev/nvme1n1 ] && break; sleep 0.1; done
echo "GUEST-BOOTED $(cat /proc/uptime)"
PATH=/usr/sbin:/usr/bin:/sbin:/bin PYTHONHOME=/py PYTHONPATH=/app:/py/site \\
  PYTHONDONTWRITEBYTECODE=1 /py/bin/python3 -S /app/guest_steps.py
echo "GUEST-EXIT $?"
sync
poweroff -f
"""


# -- cpio (newc) --------------------------------------------------------------------------

class Cpio:
    """A minimal newc writer: the kernel unpacks it as the initramfs."""

    def __init__(self):
        self.chunks, self.ino, self.seen = [], 1000, set()

    def _entry(self, name: str, mode: int, data: bytes = b"", mtime: int = 0) -> None:
        name = name.lstrip("/")
        if name in self.seen:
            return
        self.seen.add(name)
        self.ino += 1
        fields = [self.ino, mode, 0, 0, 1, mtime, len(data), 0, 0, 0, 0, len(name) + 1, 0]
        header = b"070701" + b"".join(b"%08X" % f for f in fields)
        self.chunks += [header, name.encode() + b"\0", _pad(len(header) + len(name) + 1), data, _pad(len(data))]

    def dir(self, name: str) -> None:
        parts = name.strip("/").split("/")
        for i in range(1, len(parts) + 1):
            self._entry("/".join(parts[:i]), stat.S_IFDIR | 0o755)

    def file(self, name: str, data: bytes, mode: int = 0o644, mtime: int = 0) -> None:
        self.dir(os.path.dirname(name.strip("/")) or ".")
        self._entry(name, stat.S_IFREG | mode, data, mtime)

    def symlink(self, name: str, target: str) -> None:
        self.dir(os.path.dirname(name.strip("/")))
        self._entry(name, stat.S_IFLNK | 0o777, target.encode())

    def copy(self, host: Path | str, guest: str) -> None:
        host = Path(host)
        self.file(guest, host.read_bytes(), 0o755 if os.access(host, os.X_OK) else 0o644,
                  int(host.stat().st_mtime))      # keeps the host's .pyc files valid

    def bytes(self) -> bytes:
        self._entry("TRAILER!!!", 0)
        return b"".join(self.chunks)


def _pad(n: int) -> bytes:
    return b"\0" * ((4 - n % 4) % 4)


# -- kernel ---------------------------------------------------------------------------

class GuestUnavailable(RuntimeError):
    """The guest cannot be built here (no kernel package, a tool missing)."""


def kernel_deb() -> Path:
    """Debian's current linux-image-<abi>-amd64 package in the cache (downloaded once)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    depends = subprocess.run(["apt-cache", "depends", "linux-image-amd64"], capture_output=True, text=True).stdout
    match = re.search(r"Depends: (linux-image-\S+)", depends)
    cached = sorted(CACHE.glob(f"{match.group(1) if match else 'linux-image-*-amd64'}_*.deb"))
    if not cached and match:
        subprocess.run(["apt-get", "download", match.group(1)], cwd=CACHE, capture_output=True)
        cached = sorted(CACHE.glob(f"{match.group(1)}_*.deb"))
    if not cached:
        raise GuestUnavailable("no linux-image-amd64 package: run scripts/install-disk-tools.sh")
    return cached[-1]


@contextmanager
def cache_lock():
    """One builder of the cached kernel tree and base layer at a time: two test processes
    (xdist workers, two checkouts' runs) extracting at once removed each other's files."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".qemu-guest.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def extract_kernel(deb: Path) -> Path:
    root = CACHE / deb.stem
    if not (root / ".extracted").exists():
        shutil.rmtree(root, ignore_errors=True)
        subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
        (root / ".extracted").touch()
    return root


def module_load_order(modules_dir: Path, wanted: list[str]) -> list[str]:
    """Module files (relative to `modules_dir`) in dependency order. The package ships no
    modules.dep (depmod runs at install), so read each module's `depends=` modinfo."""
    paths = {p.name.split(".ko")[0].replace("_", "-"): p for p in modules_dir.rglob("*.ko")}
    order: list[str] = []

    def visit(name: str) -> None:
        path = paths[name.replace("_", "-")]
        found = re.search(rb"\0depends=([^\0]*)\0", path.read_bytes())
        for dep in filter(None, (found.group(1).decode().split(",") if found else [])):
            visit(dep)
        rel = str(path.relative_to(modules_dir))
        if rel not in order:
            order.append(rel)

    for name in wanted:
        visit(name)
    return order


# -- binaries -------------------------------------------------------------------------

def shared_libs(binary: str) -> list[str]:
    out = subprocess.run(["ldd", binary], capture_output=True, text=True).stdout
    libs = []
    for line in out.splitlines():
        match = re.search(r"(?:=>\s*)?(/\S+)\s+\(0x", line)
        if match:
            libs.append(match.group(1))
    return libs


def add_binary(cpio: Cpio, host: str, guest: str) -> None:
    cpio.copy(os.path.realpath(host), guest)
    for lib in shared_libs(host):
        cpio.copy(os.path.realpath(lib), lib)


def base_layer() -> Path:
    """Kernel modules, busybox, disk tools, the Python interpreter: cached."""
    deb = kernel_deb()
    tools = {t: shutil.which(t) for t in TOOLS}
    missing = [t for t, p in tools.items() if p is None]
    if missing:
        raise GuestUnavailable(f"tools missing for the guest: {missing}")
    python = os.path.realpath(sys.executable)
    key = hashlib.sha256(repr((deb.name, sorted(tools.items()), python, INIT, MODULES, LVM_CONF)).encode()).hexdigest()[:16]
    out = CACHE / f"guest-base-{key}.cpio"
    if out.exists():
        return out
    root = extract_kernel(deb)
    modules_dir = next((root / "lib" / "modules").iterdir())
    cpio = Cpio()
    for d in ("proc", "sys", "dev", "run", "tmp", "etc", "srv", "state"):
        cpio.dir(d)
    cpio.file("init", INIT.encode(), 0o755)
    cpio.copy(shutil.which("busybox"), "bin/busybox")
    order = module_load_order(modules_dir, MODULES)
    for rel in order:
        cpio.copy(modules_dir / rel, f"lib/modules/{rel}")
    cpio.file("modules.order", "\n".join(order).encode())
    for name, path in tools.items():
        add_binary(cpio, path, f"usr/sbin/{name}")
    cpio.symlink("usr/sbin/mkfs.ext4", "mke2fs")
    for command in LVM_COMMANDS:
        cpio.symlink(f"usr/sbin/{command}", "lvm")
    cpio.file("etc/lvm/lvm.conf", LVM_CONF.encode())
    add_binary(cpio, python, "py/bin/python3")
    tmp = out.with_suffix(".tmp")
    tmp.write_bytes(cpio.bytes())
    tmp.replace(out)
    return out


def kernel_image() -> Path:
    root = extract_kernel(kernel_deb())
    return next((root / "boot").glob("vmlinuz-*"))


# -- the Python layer ----------------------------------------------------------------------

def imported_files() -> list[str]:
    """Every module file guest_steps.py imports (with this interpreter)."""
    probe = ("import sys, runpy; sys.path[:0] = [sys.argv[1], sys.argv[2]]; import guest_steps, encodings;"
             "print('\\n'.join(m.__file__ for m in list(sys.modules.values()) if getattr(m, '__file__', None)))")
    out = subprocess.run([sys.executable, "-c", probe, str(GUEST_SCRIPT.parent), str(REPO)],
                         capture_output=True, text=True, check=True).stdout
    return out.split()


def guest_path(host: str) -> str | None:
    host = os.path.realpath(host)
    stdlib = os.path.realpath(sysconfig.get_paths()["stdlib"])
    purelib = os.path.realpath(sysconfig.get_paths()["purelib"])
    if host == str(GUEST_SCRIPT):
        return "app/guest_steps.py"
    # site-packages first: a venv may live inside the repository
    for prefix, target in ((purelib, "py/site"), (stdlib, "py/lib/python3.11"), (str(REPO), "app")):
        if host.startswith(prefix + os.sep):
            return f"{target}/{os.path.relpath(host, prefix)}"
    return None


def python_layer() -> bytes:
    cpio = Cpio()
    files = set(imported_files())
    encodings = Path(sysconfig.get_paths()["stdlib"]) / "encodings"
    files |= {str(p) for p in encodings.glob("*.py")}
    for host in sorted(files):
        target = guest_path(host)
        if target is None:
            continue
        cpio.copy(host, target)
        compiled = importlib.util.cache_from_source(host) if host.endswith(".py") else ""
        if compiled and os.path.exists(compiled):      # compiling under TCG costs seconds
            cpio.copy(compiled, guest_path(compiled))
        if host.endswith(".so"):
            for lib in shared_libs(host):
                cpio.copy(os.path.realpath(lib), lib)
    return cpio.bytes()


# -- boot -----------------------------------------------------------------------------

def boot(workdir: Path, drives: list[Path], timeout_s: int = 600) -> tuple[str, float]:
    """Boot the guest with each of `drives` as an emulated NVMe controller with one
    namespace (/dev/nvme0n1, /dev/nvme1n1, ...); returns (serial output, seconds)."""
    import time
    initrd = workdir / "initrd.cpio"
    with cache_lock():
        base, kernel = base_layer(), kernel_image()
    initrd.write_bytes(base.read_bytes() + python_layer())
    argv = ["qemu-system-x86_64", "-machine", "q35", "-accel", "tcg", "-cpu", "max", "-m", "1024",
            "-smp", "1", "-display", "none", "-monitor", "none", "-serial", "stdio", "-no-reboot",
            "-kernel", str(kernel), "-initrd", str(initrd),
            "-append", "console=ttyS0 rdinit=/init panic=-1 loglevel=3"]
    for i, drive in enumerate(drives):
        argv += ["-drive", f"file={drive},if=none,id=nvm{i},format=raw",
                 "-device", f"nvme,serial=GPUSTORE000{i + 1},drive=nvm{i}"]
    started = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, timeout=timeout_s)
    return proc.stdout.decode("utf-8", "replace") + proc.stderr.decode("utf-8", "replace"), \
        time.monotonic() - started
