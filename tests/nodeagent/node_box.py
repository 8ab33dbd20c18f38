"""The node in a box: a QEMU q35 guest booting the Debian
image of scripts/build-node-guest-image.sh with systemd as PID 1, its root filesystem a
qcow2 overlay over the cached image (so every guest write of the run is in one file the
test can search), one emulated NVMe drive for the lease volume group, user-mode
networking (the host's loopback is 10.0.2.2 in the guest) with the guest's sshd and the
lease's ssh port forwarded to the host's loopback.

The guest runs under KVM (`-accel kvm -cpu host`) when /dev/kvm opens, answers
KVM_GET_API_VERSION and the CPU has vmx/svm, and under TCG otherwise (about ten times
slower); `accelerator()` says which and why, and the test prints it."""
import fcntl
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests import deadlines

ROOT = Path(__file__).resolve().parents[2]
ATTEMPTS = 6
BUILD = ROOT / "scripts" / "build-node-guest-image.sh"
SSH_OPTS = ["-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
            "-o", "ConnectTimeout=60", "-o", "LogLevel=ERROR", "-o", "ServerAliveInterval=15"]


KVM_GET_API_VERSION = 0xAE00


def accelerator() -> tuple[str, str]:
    """("kvm", why) when QEMU's KVM can run the guest's stock Debian kernel, else
    ("tcg", why not). /dev/kvm must open and answer KVM_GET_API_VERSION (12), and the CPU
    must offer hardware virtualization (vmx/svm): a /dev/kvm without it is PVM
    (kvm_pvm, a nested cloud VM's pagetable-based KVM), which runs only kernels built as
    PVM guests — a stock kernel hangs before its first console line."""
    try:
        fd = os.open("/dev/kvm", os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:
        return "tcg", f"/dev/kvm: {exc.strerror}"
    try:
        if fcntl.ioctl(fd, KVM_GET_API_VERSION) != 12:
            return "tcg", "/dev/kvm answers an unknown KVM API version"
    except OSError as exc:
        return "tcg", f"/dev/kvm: KVM_GET_API_VERSION: {exc.strerror}"
    finally:
        os.close(fd)
    if Path("/sys/module/kvm_pvm").exists() or not _hardware_virtualization():
        return "tcg", ("/dev/kvm is PVM (kvm_pvm, no vmx/svm on this CPU): it boots only "
                       "PVM guest kernels, not Debian's")
    return "kvm", "/dev/kvm with hardware virtualization"


def _hardware_virtualization(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("flags"):
                return bool({"vmx", "svm"} & set(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return False


def qemu_accel_args(accel: str) -> list[str]:
    if accel == "kvm":
        return ["-accel", "kvm", "-cpu", "host"]
    return ["-accel", "tcg,thread=multi", "-cpu", "max"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_image() -> Path:
    # the wheelhouse is downloaded with this interpreter's pip (the venv's, always present)
    build = subprocess.run([str(BUILD)], capture_output=True, text=True, timeout=3600,
                           env={**os.environ, "PYTHON": os.environ.get("PYTHON", sys.executable)})
    assert build.returncode == 0, build.stderr[-4000:]
    return Path(build.stdout.strip().splitlines()[-1])


class NodeBox:
    def __init__(self, image: Path, work: Path, *, lease_port: int, nvme_gb: int = 3,
                 memory_mb: int = 2048):
        self.image, self.work = image, work
        self.ssh_port, self.lease_port = free_port(), lease_port
        self.key = work / "node_ed25519"
        self.key.write_bytes((image / "id_ed25519").read_bytes())
        self.key.chmod(0o600)
        self.overlay = work / "root-overlay.qcow2"
        self.nvme = work / "lease-nvme.img"
        self.console = work / "console.log"
        self.memory_mb, self.nvme_gb = memory_mb, nvme_gb
        self.process: subprocess.Popen | None = None
        self.accel, self.accel_reason = accelerator()
        # A guest's boot and reboot take well under a minute under KVM, several under a
        # loaded 2-core TCG host: the waits are sized for the accelerator in use.
        self.boot_timeout = 300 if self.accel == "kvm" else 900  # unloaded seconds (tests/deadlines.py)

    def start(self) -> None:
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b",
                        str(self.image / "root.img"), str(self.overlay)], check=True)
        with open(self.nvme, "wb") as f:
            f.truncate(self.nvme_gb * 1024 ** 3)
        forwards = (f"hostfwd=tcp:127.0.0.1:{self.ssh_port}-:22,"
                    f"hostfwd=tcp:127.0.0.1:{self.lease_port}-:{self.lease_port}")
        argv = ["qemu-system-x86_64", "-machine", "q35", *qemu_accel_args(self.accel),
                "-smp", "2", "-m", str(self.memory_mb), "-nographic", "-monitor", "none",
                "-serial", f"file:{self.console}", "-rtc", "base=utc",
                "-kernel", str(self.image / "vmlinuz"), "-initrd", str(self.image / "initrd.img"),
                "-append", "root=/dev/vda rw console=ttyS0 net.ifnames=0 systemd.show_status=0 quiet mitigations=off fsck.mode=skip",
                "-drive", f"file={self.overlay},if=virtio,format=qcow2,cache=writeback",
                "-drive", f"file={self.nvme},if=none,id=nvm0,format=raw",
                "-device", "nvme,serial=GPUNODE0001,drive=nvm0",
                "-netdev", f"user,id=n0,{forwards}", "-device", "virtio-net-pci,netdev=n0"]
        self.process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=open(self.work / "qemu.stderr", "wb"), start_new_session=True)

    def wait_ssh(self, timeout: float | None = None) -> float:
        """Seconds until root's ssh answered."""
        timeout = timeout or self.boot_timeout
        started, deadline = time.monotonic(), deadlines.Deadline(timeout)
        while not deadline.expired():
            if self.process.poll() is not None:
                raise AssertionError(f"QEMU exited {self.process.returncode}: {self.tail()}")
            try:
                if self.ssh("true", timeout=120, check=False).returncode == 0:
                    return time.monotonic() - started
            except subprocess.TimeoutExpired:
                pass
            time.sleep(3)
        raise AssertionError(f"the guest's sshd did not answer within {deadline.waited:.0f} s "
                             f"({timeout} s unloaded): {self.tail()}")

    def ssh(self, command: str, *, timeout: float = 300, check: bool = True,
            stdin: bytes | None = None) -> subprocess.CompletedProcess:
        for _ in range(ATTEMPTS):       # a starved guest's sshd may miss the banner deadline
            result = subprocess.run(["ssh", "-i", str(self.key), "-p", str(self.ssh_port), *SSH_OPTS,
                                     "root@127.0.0.1", command], input=stdin, capture_output=True,
                                    timeout=timeout)
            if result.returncode != 255 or result.stdout or b"banner" not in result.stderr:
                break
            time.sleep(5)
        if check and result.returncode != 0:
            raise AssertionError(f"guest: {command!r} exited {result.returncode}: "
                                 f"{result.stdout.decode(errors='replace')[-2000:]}"
                                 f"{result.stderr.decode(errors='replace')[-2000:]}")
        return result

    def out(self, command: str, **kwargs) -> str:
        return self.ssh(command, **kwargs).stdout.decode()

    def put_tree(self, local: Path, remote: str) -> None:
        """Copy a directory into the guest (tar over ssh)."""
        tar = subprocess.run(["tar", "-C", str(local.parent), "--exclude=__pycache__", "--exclude=build",
                              "--exclude=*.egg-info", "-cf", "-", local.name], capture_output=True, check=True)
        self.ssh(f"mkdir -p {shlex.quote(remote)} && tar -C {shlex.quote(remote)} -xf -", stdin=tar.stdout)

    def boot_id(self) -> str:
        return self.out("cat /proc/sys/kernel/random/boot_id").strip()

    def reboot(self, timeout: float | None = None) -> float:
        """`systemctl reboot` in the guest (QEMU stays up); seconds until ssh answered again."""
        timeout = timeout or self.boot_timeout
        before = self.boot_id()
        self.ssh("systemctl reboot", check=False, timeout=30)
        started, deadline = time.monotonic(), deadlines.Deadline(timeout)
        while not deadline.expired():
            time.sleep(5)
            try:   # QEMU's user-mode forward accepts while the guest's sshd is not up yet
                result = self.ssh("cat /proc/sys/kernel/random/boot_id", timeout=30, check=False)
            except subprocess.TimeoutExpired:
                continue
            if result.returncode == 0 and result.stdout.decode().strip() != before:
                return time.monotonic() - started
        raise AssertionError(f"the guest did not come back within {deadline.waited:.0f} s "
                             f"({timeout} s unloaded): {self.tail()}")

    def keep(self) -> Path:
        """Copy the guest's ssh key and console out of the test's temporary directory
        (removed at the end of the session), for NODE_BOX_KEEP; returns where."""
        kept = Path(tempfile.mkdtemp(prefix="node-box-kept-", dir="/tmp"))
        for path in (self.key, self.console):
            if path.exists():
                shutil.copy2(path, kept / path.name)
        return kept

    def tail(self) -> str:
        return self.console.read_text(errors="replace")[-4000:] if self.console.exists() else ""

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        try:
            self.ssh("systemctl poweroff", check=False, timeout=60)
        except subprocess.TimeoutExpired:
            pass
        try:
            self.process.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(30)
