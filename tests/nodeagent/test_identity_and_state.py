"""Signing, the state files and the configuration, without outside tools."""
import base64
import json
import os
import stat
import subprocess
import sys

import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from nodeagent.config import ConfigError, load_config
from nodeagent.journal import Journal
from nodeagent.signing import NodeKey, canonical_json
from nodeagent.state import StateDir


def public_key(key: NodeKey) -> Ed25519PublicKey:
    return Ed25519PublicKey.from_public_bytes(base64.b64decode(key.public_key_b64()))


def test_private_key_file_is_owner_only_and_reloads(tmp_path):
    key = NodeKey.generate(tmp_path / "k.pem")
    assert stat.S_IMODE(os.stat(tmp_path / "k.pem").st_mode) == 0o600
    assert NodeKey.load(tmp_path / "k.pem").public_key_b64() == key.public_key_b64()
    assert len(base64.b64decode(key.public_key_b64())) == 32


def test_evidence_signature_covers_the_canonical_json_without_signature(tmp_path):
    key = NodeKey.generate(tmp_path / "k.pem")
    record = key.sign_record({"kind": "instance_ready", "lease_id": 4, "node": "ñode",
                              "gpus": ["GPU-1"], "at": "2026-12-01T00:00:00Z"})
    unsigned = {k: v for k, v in record.items() if k != "signature"}
    expected = json.dumps(unsigned, sort_keys=True, separators=(",", ":"),
                          ensure_ascii=False).encode()
    assert canonical_json(unsigned) == expected
    public_key(key).verify(base64.b64decode(record["signature"]), expected)   # raises if bad
    tampered = canonical_json({**unsigned, "lease_id": 5})
    with pytest.raises(InvalidSignature):
        public_key(key).verify(base64.b64decode(record["signature"]), tampered)


def test_report_seq_is_persisted_before_use(tmp_path):
    state = StateDir(tmp_path)
    assert [state.next_seq(), state.next_seq()] == [1, 2]
    assert StateDir(tmp_path).next_seq() == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["seq.json"]   # no temp files left


def test_journal_survives_reopening_and_keeps_errors_per_op(tmp_path):
    journal = Journal(tmp_path / "j.json")
    journal.failed(1, "1:running:1", "image_missing", "no image")
    assert Journal(tmp_path / "j.json").error_for(1, "1:running:1") == {
        "code": "image_missing", "detail": "no image"}
    assert Journal(tmp_path / "j.json").error_for(1, "1:running:2") is None
    journal.done(1, "1:running:1", state="running")
    reopened = Journal(tmp_path / "j.json")
    assert reopened.is_done("1:running:1") and reopened.error_for(1, "1:running:1") is None


def test_config_file_is_read_and_checked(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('state_dir = "/x"\ndisk_backend = "directory"\n[docker]\n'
                    'gpu_mode = "cdi"\nport_range = [23000, 23010]\n[images]\n"a" = "b:1"\n')
    config = load_config(path)
    assert (config.docker.gpu_mode, config.docker.port_range) == ("cdi", (23000, 23010))
    assert config.images == {"a": "b:1"} and str(config.state_dir) == "/x"
    path.write_text('[docker]\ngpu_mode = "magic"\n')
    with pytest.raises(ConfigError, match="gpu_mode"):
        load_config(path)
    path.write_text('storfront_url = "typo"\n')
    with pytest.raises(ConfigError, match="storfront_url"):
        load_config(path)
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.toml")


def test_the_agent_imports_no_django():
    code = ("import sys, nodeagent.cli, nodeagent.agent, nodeagent.runtime.docker, "
            "nodeagent.directory_disks, nodeagent.luks_config; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'django'))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"


def test_luks_backend_is_built_by_the_disks_package_from_the_config_table(tmp_path):
    from nodeagent.config import ConfigError
    from nodeagent.disks import LuksDisks
    from nodeagent.luks_config import open_luks_disks

    disks = open_luks_disks({"volume_group": "gpu-leases"}, tmp_path)  # lvm is the default carver
    assert isinstance(disks, LuksDisks)
    with pytest.raises(ConfigError, match="volume_group"):
        open_luks_disks({"carver": "lvm"}, tmp_path)
    with pytest.raises(ConfigError, match="carver"):
        open_luks_disks({"carver": "floppy"}, tmp_path)
