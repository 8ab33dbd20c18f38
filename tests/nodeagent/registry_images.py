"""Images for the customer-image tests, and the local registry that serves them
(tests/nodeagent/registry.py in the node's network namespace): a static busybox root with no
sshd and no libc, a layer with no shell at all."""
import io
import subprocess
import sys
import tarfile
from pathlib import Path

from tests.tools import require_tool

REGISTRY = Path(__file__).with_name("registry.py")


def busybox_layer(path: Path) -> Path:
    """A root file system of the static busybox and its applets' links: no sshd, no libc."""
    busybox = require_tool("busybox", "busybox-static")
    applets = subprocess.run([busybox, "--list"], capture_output=True, text=True,
                             check=True).stdout.split()
    with tarfile.open(path, "w") as tar:
        for name in ("bin", "etc", "root", "tmp", "var", "workspace"):
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if name == "tmp" else 0o755
            tar.addfile(info)
        tar.add(busybox, "bin/busybox")
        for applet in applets:
            if applet != "busybox":
                link = tarfile.TarInfo(f"bin/{applet}")
                link.type, link.linkname = tarfile.SYMTYPE, "busybox"
                tar.addfile(link)
        for name, text in (("etc/passwd", "root:x:0:0:root:/root:/bin/sh\n"),
                           ("etc/group", "root:x:0:\n")):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return path


def shellless_layer(path: Path) -> Path:
    with tarfile.open(path, "w") as tar:
        data = b"no shell here\n"
        info = tarfile.TarInfo("hello.txt")
        info.size, info.mode = len(data), 0o644
        tar.addfile(info, io.BytesIO(data))
    return path


class Registry:
    def __init__(self, netns, layer: Path, gate: Path, repo: str, *, auth: str = "",
                 hold_after: int = 0):
        self.repo, self.gate = repo, gate
        argv = ["ip", "netns", "exec", netns.node, sys.executable, str(REGISTRY), "--layer",
                str(layer), "--repo", repo, "--tags", "1", "--gate", str(gate),
                "--hold-after", str(hold_after)]
        if auth:
            argv += ["--auth", auth]
        self.process = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        self.port = int(self.process.stdout.readline())

    def ref(self, tag: str = "1") -> str:
        return f"127.0.0.1:{self.port}/{self.repo}:{tag}"

    def stop(self) -> None:
        self.gate.unlink(missing_ok=True)
        self.process.terminate()
        self.process.wait(10)
