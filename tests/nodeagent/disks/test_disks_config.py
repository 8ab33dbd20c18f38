"""The `[disks]` config table builds the backend the operator chose, and refuses
incomplete or unknown choices with a clear message."""
import tomllib

import pytest

from nodeagent.disks import DevicePoolCarver, LvmCarver, disks_from_config
from nodeagent.disks.backend import VERIFY_SAMPLES

CONFIG = """
[disks]
carver = "devices"
devices = { "/dev/nvme1n1" = "drive", "/dev/nvme0n1p4" = "shared" }
mount_root = "/srv/leases"
kek_path = "/run/credentials/gpu-node-agent.service/disk-kek"
verify_samples = 128
"""


def test_device_pool_from_toml(tmp_path):
    disks = disks_from_config(tomllib.loads(CONFIG)["disks"], state_dir=tmp_path)
    assert isinstance(disks.carver, DevicePoolCarver)
    assert disks.carver.devices == {"/dev/nvme1n1": "drive", "/dev/nvme0n1p4": "shared"}
    assert str(disks.keys.kek_path) == "/run/credentials/gpu-node-agent.service/disk-kek"
    assert str(disks.mount_root) == "/srv/leases" and disks.verify_samples == 128


def test_lvm_with_defaults(tmp_path):
    disks = disks_from_config({"carver": "lvm", "volume_group": "gpu-leases"}, state_dir=tmp_path)
    assert disks.carver == LvmCarver("gpu-leases")
    assert disks.keys.kek_path == tmp_path / "disk.kek" and disks.verify_samples == VERIFY_SAMPLES == 3000
    assert disks.mount_root == tmp_path / "mnt"


@pytest.mark.parametrize(("section", "message"), [
    ({}, "carver must be"),
    ({"carver": "zfs"}, "carver must be"),
    ({"carver": "lvm"}, "needs volume_group"),
    ({"carver": "devices"}, "needs a devices table"),
    ({"carver": "devices", "devices": {"/dev/sdz": "whole"}}, "unknown scope"),
])
def test_bad_config_is_refused_clearly(tmp_path, section, message):
    with pytest.raises(ValueError, match=message):
        disks_from_config(section, state_dir=tmp_path)
