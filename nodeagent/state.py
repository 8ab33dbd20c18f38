"""The agent's small on-disk state: credential, signing key, report counter, operation
journal. Every write is atomic (temporary file + fsync + rename) so a crash or power cut
leaves either the old or the new file, never half of one."""
import json
import os
import tempfile
from pathlib import Path


def write_atomic(path: Path, data: bytes, mode: int = 0o600) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read_json(path: Path, default):
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return default


def write_json(path: Path, value) -> None:
    write_atomic(path, json.dumps(value, indent=1, sort_keys=True).encode())


class StateDir:
    """Files under the state dir (default /var/lib/gpu-node-agent)."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    @property
    def enrolment_path(self) -> Path:       # node name, storefront url, credential
        return self.root / "enrolment.json"

    @property
    def key_path(self) -> Path:             # Ed25519 private key, PEM, 0600
        return self.root / "node-key.pem"

    @property
    def seq_path(self) -> Path:
        return self.root / "seq.json"

    @property
    def journal_path(self) -> Path:
        return self.root / "journal.json"

    @property
    def outbox_path(self) -> Path:          # signed evidence not yet delivered
        return self.root / "outbox.json"

    @property
    def status_path(self) -> Path:          # what `gpu-node-agent status` shows
        return self.root / "status.json"

    @property
    def runtime_dir(self) -> Path:
        return self.root / "runtime"

    def ensure(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)

    def next_seq(self) -> int:
        """The next report number, persisted BEFORE it is used: a crash after sending can
        only skip a number, never reuse one (the storefront refuses replays)."""
        seq = read_json(self.seq_path, {"seq": 0})["seq"] + 1
        write_json(self.seq_path, {"seq": seq})
        return seq

    def skip_seq(self, by: int) -> None:
        seq = read_json(self.seq_path, {"seq": 0})["seq"] + by
        write_json(self.seq_path, {"seq": seq})
