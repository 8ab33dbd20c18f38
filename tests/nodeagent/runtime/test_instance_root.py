"""nodeagent/runtime/instance_root.py on plain directories: the overlay2 layer's `diff` and
`work` become links to the lease's disk, once, with dockerd's ownership; a bare mount point
(the disk not mounted) is refused, never filled; a layer that already holds files on the
node is not moved silently. Snapshots leave the instance's root out and a replacing
restore keeps it. Against a real dockerd: test_tenant_bytes.py."""
import os
import subprocess
from pathlib import Path

import pytest

from nodeagent.interfaces import OperationFailed
from nodeagent.runtime.instance_root import (
    INSTANCE_ROOT,
    etc_binds,
    forget_other_layers,
    layer_on_disk,
    place_layer,
)
from nodeagent.snapshots import Job, Repository, empty_directory, take_snapshot
from tests.tools import require_tool

REMAPPED = 165536          # container root's host uid under userns-remap


def docker_layer(root: Path, layer_id: str = "abc") -> str:
    """What overlay2 makes at `create`: <layer>/diff (0755) and <layer>/work (0700), both
    owned by container root. Returns the UpperDir."""
    layer = root / "overlay2" / layer_id
    for name, mode in (("diff", 0o755), ("work", 0o700)):
        (layer / name).mkdir(parents=True)
        os.chown(layer / name, REMAPPED, REMAPPED)
        (layer / name).chmod(mode)
    (layer / "link").write_text("SHORTID")
    return str(layer / "diff")


def test_the_layer_moves_to_the_lease_disk_with_its_owner_and_mode(tmp_path):
    upper, disk = docker_layer(tmp_path / "docker"), tmp_path / "lease"
    disk.mkdir()
    assert place_layer(upper, str(disk), "c1") == ["diff", "work"]
    home = disk / INSTANCE_ROOT / "layers" / "c1"
    for name, mode in (("diff", 0o755), ("work", 0o700)):
        link = Path(upper).parent / name
        assert link.is_symlink() and os.readlink(link) == str(home / name)
        st = os.stat(home / name)
        assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (REMAPPED, REMAPPED, mode)
    assert layer_on_disk(upper, str(disk), "c1")
    assert place_layer(upper, str(disk), "c1") == []           # idempotent
    # only root passes through; nobody but root lists the layers
    assert os.stat(disk / INSTANCE_ROOT).st_mode & 0o777 == 0o711
    assert os.stat(disk / INSTANCE_ROOT / "layers").st_mode & 0o777 == 0o700


def test_a_bare_mount_point_is_refused_and_left_empty(tmp_path):
    upper, disk = docker_layer(tmp_path / "docker"), tmp_path / "lease"
    disk.mkdir()
    place_layer(upper, str(disk), "c1")
    disk.rename(tmp_path / "elsewhere")             # the disk's files, unmounted
    disk.mkdir()                                    # the bare mount point under the disk
    with pytest.raises(OperationFailed) as refused:
        place_layer(upper, str(disk), "c1")
    assert refused.value.code == "disk_not_mounted"
    assert list(disk.iterdir()) == []


def test_a_layer_already_written_on_the_node_is_not_moved(tmp_path):
    upper, disk = docker_layer(tmp_path / "docker"), tmp_path / "lease"
    disk.mkdir()
    (Path(upper) / "root").mkdir()                  # a container ran with it (older agent)
    with pytest.raises(OperationFailed, match="must be recreated"):
        place_layer(upper, str(disk), "c1")
    assert Path(upper).is_dir() and not Path(upper).is_symlink()


def test_other_containers_layers_are_forgotten(tmp_path):
    disk = tmp_path / "lease"
    for layer_id in ("old", "new"):
        place_layer(docker_layer(tmp_path / "docker", layer_id), str(disk), layer_id)
    assert forget_other_layers(str(disk), keep="new") == ["old"]
    assert [p.name for p in (disk / INSTANCE_ROOT / "layers").iterdir()] == ["new"]


def test_etc_files_belong_to_container_root_and_keep_the_tenants_edits(tmp_path):
    disk = tmp_path / "lease"
    disk.mkdir()
    binds = etc_binds(str(disk), "lease-5", owner=REMAPPED)
    assert sorted(b["bind"] for b in binds.values()) == ["/etc/hostname", "/etc/hosts",
                                                         "/etc/resolv.conf"]
    hosts = disk / INSTANCE_ROOT / "etc" / "hosts"
    assert os.stat(hosts).st_uid == REMAPPED and "127.0.1.1\tlease-5" in hosts.read_text()
    hosts.write_text("10.0.0.9 my-db\n")
    etc_binds(str(disk), "lease-5", owner=REMAPPED)
    assert hosts.read_text() == "10.0.0.9 my-db\n"


def test_a_replacing_restore_keeps_the_instance_root(tmp_path):
    disk = tmp_path / "lease"
    (disk / INSTANCE_ROOT / "layers").mkdir(parents=True)
    (disk / "lost+found").mkdir()
    (disk / "old-checkpoint").write_text("x")
    assert empty_directory(str(disk)) == 1
    assert sorted(p.name for p in disk.iterdir()) == [INSTANCE_ROOT, "lost+found"]


def test_a_snapshot_copies_the_workspace_without_the_instance_root(tmp_path):
    require_tool("restic")
    disk = tmp_path / "lease"
    (disk / INSTANCE_ROOT / "layers" / "c1" / "diff" / "root").mkdir(parents=True)
    (disk / INSTANCE_ROOT / "layers" / "c1" / "diff" / "root" / "pip-cache").write_text("wheel")
    (disk / "model.bin").write_text("weights")
    repo = Repository(url=str(tmp_path / "repo"), access_key="", secret_key="", password="pw")
    taken = take_snapshot(Job("snapshot", "op1"), repo=repo, source=str(disk), tags=[],
                          pause=lambda: False, resume=lambda: None)
    listed = subprocess.run(["restic", "--no-cache", "ls", taken["restic_snapshot"]],
                            env=repo.env(), capture_output=True, text=True, check=True).stdout
    assert "/model.bin" in listed.splitlines()      # paths relative to the disk
    assert INSTANCE_ROOT not in listed
