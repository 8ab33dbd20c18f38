"""SSH into any image (docs/adr/0014-customer-images-and-ssh.md).

A customer's image need not hold an SSH server. The node's own OpenSSH (`sshd`,
`sftp-server`, `ssh-keygen`) is copied, with its dynamic loader and every library `ldd`
names, into a directory of its own (`[docker] ssh_bundle_dir`, keyed by the binaries'
hash) that each instance gets read-only at `BUNDLE_MOUNT`. It runs through that loader
(`ld.so --library-path …`), so it needs nothing from the image's libc: glibc, musl or a
static busybox image alike. Only `/bin/sh` is needed (`image_no_shell` otherwise).

The instance's PID 1 is `LAUNCHER` under the image's /bin/sh: it sends its output to
/var/log/instance.log, exports the lease's variables, starts the lease's start command in the background (its process
group, cwd /workspace), then becomes sshd: the image's own /usr/sbin/sshd when it has
one (as before: operator templates and images built for SSH keep theirs), else the
bundle's, with the bundle's own configuration (keys only, root by key). sshd stays up
whatever the start command does, and reaps it."""
import hashlib
import logging
import os
import re
import shutil
import subprocess
from pathlib import Path

from ..interfaces import OperationFailed

log = logging.getLogger(__name__)

BUNDLE_MOUNT = "/.gpu-node-ssh"          # inside every instance, read-only
BINARIES = {"sshd": "/usr/sbin/sshd", "sftp-server": "/usr/lib/openssh/sftp-server",
            "ssh-keygen": "/usr/bin/ssh-keygen"}
LOADER = "ld.so"
HOST_KEY = "/etc/ssh/gpu_node_host_ed25519_key"    # made at first start, in the instance
ENV_FILE = "/.gpu-node-env"      # the lease's variables (NAME='value' lines), by the agent
_LDD_LINE = re.compile(r"^\s*(?:(\S+)\s+=>\s+)?(/\S+)\s+\(0x[0-9a-f]+\)\s*$")

# The bundle's sshd: keys only, root by key (as the image's sshd is told on its command
# line), the lease's variables from ~/.ssh/environment (written by the agent), no PAM (the image may have none), no re-exec (-r below: it would exec sshd by
# its path, without the bundle's loader), SFTP through the bundle too (scp uses it).
SSHD_CONFIG = f"""\
HostKey {HOST_KEY}
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
UsePAM no
PidFile none
PrintMotd no
PermitUserEnvironment yes
AuthorizedKeysFile .ssh/authorized_keys
Subsystem sftp {BUNDLE_MOUNT}/lib/{LOADER} --library-path {BUNDLE_MOUNT}/lib {BUNDLE_MOUNT}/bin/sftp-server
"""

# PID 1 of every instance, run by the image's /bin/sh with the start command as $1.
# Why each step: /var/log may not exist in a slim image; the start command runs in a
# subshell so that sshd (exec'd last, keeping PID 1) reaps it; sshd's privilege separation
# needs its user and /run/sshd, which an image without sshd lacks. The lease's variables
# come from a file on the lease's disk (container_options.py `_install_env`), exported to the
# start command and sshd.
LAUNCHER = f"""\
mkdir -p /var/log; exec >>/var/log/instance.log 2>&1
if [ -f {ENV_FILE} ]; then set -a; . {ENV_FILE}; set +a; fi
if [ -n "$1" ]; then (cd /workspace && exec /bin/sh -c "$1") & fi
if [ -x /usr/sbin/sshd ]; then
  ssh-keygen -A && mkdir -p /run/sshd &&
  exec /usr/sbin/sshd -D -e -p 22 -o PasswordAuthentication=no -o PermitRootLogin=prohibit-password \\
    -o PermitUserEnvironment=yes
fi
B={BUNDLE_MOUNT}
if [ ! -x "$B/bin/sshd" ]; then echo "no sshd in the image and none from the node"; exit 1; fi
mkdir -p /etc/ssh /run/sshd && chmod 0755 /run/sshd
u=; [ -f /etc/passwd ] && while IFS=: read -r n rest; do [ "$n" = sshd ] && u=1; done </etc/passwd
[ -n "$u" ] || echo 'sshd:x:74:65534:sshd:/run/sshd:/bin/false' >>/etc/passwd
[ -s {HOST_KEY} ] || "$B/lib/{LOADER}" --library-path "$B/lib" "$B/bin/ssh-keygen" -q -t ed25519 -N '' -f {HOST_KEY}
exec "$B/lib/{LOADER}" --library-path "$B/lib" "$B/bin/sshd" -D -e -r -f "$B/sshd_config" -p 22
"""


def build_bundle(root: str | Path, binaries: dict[str, str] | None = None) -> Path:
    """The bundle directory for the node's current OpenSSH (made once per version):
    `bin/` the binaries, `lib/` their libraries and the loader, `sshd_config`."""
    binaries = dict(BINARIES if binaries is None else binaries)
    missing = [path for path in binaries.values() if not os.path.isfile(path)]
    if missing:
        raise OperationFailed("runtime_error", f"no {', '.join(missing)} on this node (install "
                              "openssh-server): images without sshd cannot be reached")
    digest = hashlib.sha256(SSHD_CONFIG.encode())
    for name in sorted(binaries):
        digest.update(name.encode() + Path(binaries[name]).read_bytes())
    root = Path(root)
    target = root / digest.hexdigest()[:16]
    if (target / "sshd_config").is_file():
        return target
    libraries, loader = {}, None
    for path in binaries.values():
        found, found_loader = _libraries(path)
        libraries.update(found)
        loader = loader or found_loader
    if loader is None:
        raise OperationFailed("runtime_error", f"ldd names no loader for {binaries['sshd']}")
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o755)            # container root (a remapped uid) passes through it
    work = root / f".{target.name}.{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    (work / "bin").mkdir(parents=True)
    (work / "lib").mkdir()
    for name, path in binaries.items():
        shutil.copyfile(path, work / "bin" / name)
        os.chmod(work / "bin" / name, 0o755)
    for name, path in libraries.items():
        shutil.copyfile(path, work / "lib" / name)
        os.chmod(work / "lib" / name, 0o755)
    shutil.copyfile(loader, work / "lib" / LOADER)
    os.chmod(work / "lib" / LOADER, 0o755)
    (work / "sshd_config").write_text(SSHD_CONFIG)
    for path in (work, work / "bin", work / "lib"):
        os.chmod(path, 0o755)
    os.chmod(work / "sshd_config", 0o644)
    try:
        os.rename(work, target)
    except OSError:
        shutil.rmtree(work, ignore_errors=True)
        if not (target / "sshd_config").is_file():
            raise
        return target                # another agent process made the same one meanwhile
    log.info("SSH bundle for images without sshd: %s (%d libraries)", target, len(libraries))
    return target


def _libraries(binary: str) -> tuple[dict[str, str], str | None]:
    """{soname: host path} and the loader of a dynamically linked binary, from ldd."""
    result = subprocess.run(["ldd", binary], capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        raise OperationFailed("runtime_error", f"ldd {binary}: {result.stderr.strip()[:200]}")
    libraries, loader = {}, None
    for line in result.stdout.splitlines():
        match = _LDD_LINE.match(line)
        if match is None:
            continue
        soname, path = match.groups()
        if soname is None:
            loader = path            # "/lib64/ld-linux-x86-64.so.2 (0x…)"
        else:
            libraries[soname] = os.path.realpath(path)
    return libraries, loader
