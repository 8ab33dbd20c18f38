"""LUKS2 header work on real loop devices with the real cryptsetup: format with a random
key over stdin, key destruction proven, idempotent, and a failed destruction not done."""
import json
import subprocess

import pytest

from nodeagent.disks.runner import RECENT_KEPT
from nodeagent.interfaces import OperationFailed

from .conftest import make_disks, run

LEASE = 42


def keyslots(device: str) -> dict:
    return json.loads(run("cryptsetup", "luksDump", "--dump-json-metadata", device).stdout)["keyslots"]


def opens_with(device: str, key: bytes) -> bool:
    return run("cryptsetup", "open", "--test-passphrase", "--key-file", "-", device, stdin=key).returncode == 0


def all_files_bytes(root) -> bytes:
    return b"".join(p.read_bytes() for p in root.rglob("*") if p.is_file() and not p.name.endswith(".img"))


def test_provision_formats_luks2_with_a_random_key_that_never_touches_disk(tmp_path, disks, loop_device):
    disk = disks.provision(LEASE, size_gb=0)
    key = bytes(disks.keys.load(LEASE))

    assert len(key) == 64
    assert run("cryptsetup", "isLuks", "--type", "luks2", loop_device).returncode == 0
    assert disk.luks_uuid == run("cryptsetup", "luksUUID", loop_device).stdout.decode().strip()
    assert len(keyslots(loop_device)) == 1 and opens_with(loop_device, key)
    # Only the wrapped form is stored; neither argv nor the recorded stderr carries the key.
    assert key not in all_files_bytes(tmp_path) and key.hex() not in all_files_bytes(tmp_path).decode("latin-1")
    recorded = " ".join(" ".join(c.argv) + c.output for c in disks.runner.commands)
    assert "--key-file -" in recorded and key.hex() not in recorded
    # Repeating it (agent restart) neither reformats nor changes the key.
    assert disks.provision(LEASE, size_gb=0).luks_uuid == disk.luks_uuid
    assert opens_with(loop_device, key)


def test_key_survives_an_agent_restart_but_not_another_nodes_kek(tmp_path, disks, loop_device):
    disks.provision(LEASE, size_gb=0)
    restarted = make_disks(tmp_path, loop_device)            # fresh process state, same node
    assert opens_with(loop_device, bytes(restarted.keys.load(LEASE)))

    (tmp_path / "kek" / "node-disk.kek").write_bytes(bytes(32))    # another node's KEK
    with pytest.raises(OperationFailed) as refused:
        make_disks(tmp_path, loop_device).keys.load(LEASE)
    assert refused.value.code == "disk_key_unreadable"


def test_a_missing_kek_is_never_silently_replaced(tmp_path, disks, loop_device):
    disks.provision(LEASE, size_gb=0)
    kek = tmp_path / "kek" / "node-disk.kek"
    kek.rename(tmp_path / "kek" / "elsewhere")                 # e.g. the credential did not load

    with pytest.raises(OperationFailed) as missing:
        make_disks(tmp_path, loop_device).keys.load(LEASE)

    assert missing.value.code == "disk_kek_missing" and not kek.exists()


def test_destroy_key_erases_every_keyslot_and_proves_the_old_key_fails(disks, loop_device):
    disks.provision(LEASE, size_gb=0)
    old_key = bytes(disks.keys.load(LEASE))

    evidence = disks.destroy_key(LEASE)

    assert evidence.details["test_passphrase_exit"] != 0 and evidence.details["keyslots_after"] == 0
    assert evidence.details["luks_uuid"] == run("cryptsetup", "luksUUID", loop_device).stdout.decode().strip()
    ran = [(c.argv[:2], c.exit) for c in evidence.commands]
    assert (["cryptsetup", "luksErase"], 0) in ran
    assert any(argv == ["cryptsetup", "open"] and code != 0 for argv, code in ran)
    # Independently of the backend: the header has no keyslot and the old key opens nothing.
    assert keyslots(loop_device) == {}
    assert not opens_with(loop_device, old_key)
    assert not disks.keys.has_key(LEASE)                      # the wrapped copy is shredded


def test_destroy_key_twice_reports_the_same_proof_without_rerunning(disks):
    disks.provision(LEASE, size_gb=0)
    first = disks.destroy_key(LEASE)
    commands_before = len(disks.runner.commands)

    second = disks.destroy_key(LEASE)

    assert second.details == first.details
    assert [(c.argv, c.exit) for c in second.commands] == [(c.argv, c.exit) for c in first.commands]
    assert len(disks.runner.commands) == commands_before


def test_a_failed_destruction_raises_keeps_the_key_and_is_not_recorded(disks, loop_device):
    disks.provision(LEASE, size_gb=0)
    old_key = bytes(disks.keys.load(LEASE))
    subprocess.run(["blockdev", "--setro", loop_device], check=True)   # luksErase cannot write

    with pytest.raises(OperationFailed) as failed:
        disks.destroy_key(LEASE)

    assert failed.value.code == "key_destroy_failed"
    assert disks.state.load(LEASE).key_destroyed is None
    assert opens_with(loop_device, old_key) and disks.keys.has_key(LEASE)

    subprocess.run(["blockdev", "--setrw", loop_device], check=True)   # the retry succeeds
    assert disks.destroy_key(LEASE).details["keyslots_after"] == 0
    assert not opens_with(loop_device, old_key)


def test_a_destroyed_disk_is_never_reopened_or_reformatted(disks):
    disks.provision(LEASE, size_gb=0)
    disks.destroy_key(LEASE)
    with pytest.raises(OperationFailed):
        disks.provision(LEASE, size_gb=0)


def test_the_agents_runner_keeps_only_recent_commands_while_evidence_keeps_all(disks):
    disks.provision(LEASE, size_gb=0)
    for _ in range(RECENT_KEPT + 10):                          # an agent polling for days
        disks.provision(LEASE, size_gb=0)
    assert len(disks.runner.commands) == RECENT_KEPT
    assert len(disks.destroy_key(LEASE).commands) == 3        # luksErase, test, luksDump


def test_destroying_an_unknown_lease_fails_clearly(disks):
    with pytest.raises(OperationFailed) as unknown:
        disks.destroy_key(999)
    assert unknown.value.code == "disk_unknown"
