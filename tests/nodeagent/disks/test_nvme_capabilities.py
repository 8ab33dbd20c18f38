"""Wipe method choice from `nvme id-ctrl -o json` of real drive models: the strongest
method that spares neighbours, and never a format without secure erase (SES=0)."""
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodeagent.disks.nvme import (
    SANITIZE_DONE,
    SANITIZE_FAILED,
    SANITIZE_RUNNING,
    SCOPE_DRIVE,
    SCOPE_NAMESPACE,
    SCOPE_SHARED,
    NvmeCapabilities,
    choose_method,
    sanitize_status,
)
from nodeagent.disks.runner import Runner
from nodeagent.disks.wipe import format_namespace

FIXTURES = Path(__file__).parent / "fixtures"
METHODS = {"sanitize-crypto", "sanitize-block", "format-ses2", "format-ses1", "discard+overwrite"}


def caps(name: str) -> NvmeCapabilities:
    return NvmeCapabilities.from_id_ctrl((FIXTURES / name).read_text())


@pytest.mark.parametrize(("fixture", "scope", "method"), [
    ("enterprise-pm9a3-like.json", SCOPE_DRIVE, "sanitize-crypto"),
    ("enterprise-pm9a3-like.json", SCOPE_NAMESPACE, "format-ses2"),     # fna: per namespace
    ("enterprise-pm9a3-like.json", SCOPE_SHARED, "discard+overwrite"),
    ("enterprise-block-only.json", SCOPE_DRIVE, "sanitize-block"),
    ("enterprise-block-only.json", SCOPE_NAMESPACE, "discard+overwrite"),  # format hits all ns
    ("client-crypto-format.json", SCOPE_DRIVE, "format-ses2"),
    ("client-format-only.json", SCOPE_DRIVE, "format-ses1"),
    ("client-format-only.json", SCOPE_NAMESPACE, "discard+overwrite"),
    ("no-secure-erase.json", SCOPE_DRIVE, "discard+overwrite"),
    ("qemu-nvme-recorded.json", SCOPE_DRIVE, "format-ses1"),
])
def test_strongest_method_that_spares_neighbours(fixture, scope, method):
    assert choose_method(caps(fixture), scope) == method


def test_identity_fields_are_read_and_unpadded():
    drive = caps("enterprise-pm9a3-like.json")
    assert (drive.model, drive.serial, drive.firmware) == (
        "SAMSUNG MZQL23T8HCLS-00A07", "S64HNE0R700123", "GDC5602Q")
    assert drive.sanitize_crypto and drive.sanitize_block and not drive.sanitize_overwrite
    assert json.loads((FIXTURES / "enterprise-pm9a3-like.json").read_text())["sanicap"] == 0x60000003


@given(sanicap=st.integers(0, 2**32 - 1), fna=st.integers(0, 255), oacs=st.integers(0, 2**16 - 1),
       scope=st.sampled_from([SCOPE_DRIVE, SCOPE_NAMESPACE, SCOPE_SHARED]))
def test_never_ses0_and_never_beyond_the_lease(sanicap, fna, oacs, scope):
    drive = NvmeCapabilities("m", "s", "f", sanicap=sanicap, fna=fna, oacs=oacs)
    method = choose_method(drive, scope)
    assert method in METHODS
    if scope == SCOPE_SHARED:
        assert method == "discard+overwrite"
    if method.startswith("sanitize-"):
        assert scope == SCOPE_DRIVE
    if method.startswith("format-") and scope == SCOPE_NAMESPACE:
        assert fna & 0b11 == 0
    if method == "format-ses2":
        assert fna & 0b100


def test_no_capabilities_means_discard_and_overwrite():
    assert choose_method(None, SCOPE_DRIVE) == "discard+overwrite"


def test_a_format_without_secure_erase_is_refused_before_running_anything():
    runner = Runner()
    with pytest.raises(ValueError):
        format_namespace(runner, "/dev/nvme0n1", 0)
    assert not runner.commands


@pytest.mark.parametrize(("log", "status"), [
    ('{"nvme0": {"sprog": 65535, "sstat": 1, "cdw10_info": 4}}', SANITIZE_DONE),
    ('{"sprog": 1200, "sstat": {"status": 2, "global_erased": 0}}', SANITIZE_RUNNING),
    ('{"nvme1": {"sprog": 0, "sstat": 259}}', SANITIZE_FAILED),
])
def test_sanitize_log_status_in_both_nvme_cli_shapes(log, status):
    assert sanitize_status(log)[0] == status
