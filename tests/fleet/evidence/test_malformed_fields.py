"""A signed evidence record whose fields are not what PROTOCOL.md says ("Evidence
records": the common fields, `commands`) is refused item by item with the protocol's error
code, and nothing of it is stored or applied — a well-signed record is not a well-formed one."""
import pytest

from fleet.crypto import canonical_json
from fleet.models import Evidence
from rental.models import DiskKey, LeaseState
from tests.fleet.conftest import key_destroyed, node_of, provision_then_release, ready
from tests.fleet.helpers import refused

pytestmark = pytest.mark.django_db


def signed(node, record: dict, **changes) -> dict:
    """`record` (one the node would send) with `changes`, signed by the node again."""
    record = {k: v for k, v in record.items() if k != "signature"} | changes
    return {**record, "signature": node.sign(canonical_json(record))}


def test_the_common_fields_are_checked_before_anything_is_stored(paid_lease, enrol):
    """`lease_id` a positive integer, `op_id` a string of 1–80 characters, `signature` a
    string of at most 120 (an Ed25519 signature in base64 is 88): anything else is `invalid`.
    An `op_id` of exactly 80 characters is read, and is refused only as not requested."""
    lease = paid_lease()
    node = enrol(node_of(lease))
    good = ready(node, lease)
    long_op = f"{lease.pk}:running:".ljust(80, "9")
    cases = [
        ({"lease_id": str(lease.pk)}, "invalid"),
        ({"lease_id": 0}, "invalid"),
        ({"lease_id": True}, "invalid"),                # a JSON true is not a lease
        ({"lease_id": None}, "invalid"),
        ({"op_id": ""}, "invalid"),
        ({"op_id": 7}, "invalid"),
        ({"op_id": long_op + "9"}, "invalid"),
        ({"op_id": long_op}, "not_requested"),
    ]
    for changes, code in cases:
        assert refused(node, signed(node, good, **changes)) == [{"item": "evidence[0]", "error": code}], changes
    for signature, code in (("", "invalid"), (None, "invalid"), ("A" * 121, "invalid"), ("A" * 120, "bad_signature")):
        assert refused(node, {**good, "signature": signature}) == [{"item": "evidence[0]", "error": code}], signature
    assert not Evidence.objects.exists()
    lease.refresh_from_db()
    assert lease.state == LeaseState.PROVISIONING and lease.ssh_command == ""
    assert node.report(evidence=[good]).json()["accepted"] == ["evidence[0]"]   # the record itself was good


def test_a_key_destruction_whose_commands_are_malformed_is_invalid_and_destroys_nothing(paid_lease, enrol):
    """`commands` is a list of at most 100 `{"argv": [...], "exit": N}`, N an integer from
    −2³¹ to 2³¹ (a process killed by a signal reports a negative status): anything else is
    `invalid`, and the key stays to be destroyed. The longest, widest record is accepted."""
    lease = paid_lease()
    node = enrol(node_of(lease))
    provision_then_release(node, lease)
    assert DiskKey.objects.get(lease=lease).state == DiskKey.State.DESTROY_REQUESTED
    erase = ["cryptsetup", "erase", "/dev/vg/lease"]
    bad = {
        "missing": None,
        "a shell line": "cryptsetup erase /dev/vg/lease",
        "an item that is a string": ["cryptsetup erase /dev/vg/lease"],
        "argv a string": [{"argv": "cryptsetup erase /dev/vg/lease", "exit": 0}],
        "no argv": [{"exit": 0}],
        "no exit": [{"argv": erase}],
        "exit a string": [{"argv": erase, "exit": "0"}],
        "exit a float": [{"argv": erase, "exit": 0.0}],
        "exit under the range": [{"argv": erase, "exit": -(2**31) - 1}],
        "exit over the range": [{"argv": erase, "exit": 2**31 + 1}],
        "101 commands": [{"argv": erase, "exit": 0}] * 101,
    }
    for case, commands in bad.items():
        record = signed(node, key_destroyed(node, lease), commands=commands)
        assert refused(node, record) == [{"item": "evidence[0]", "error": "invalid"}], case
    assert not Evidence.objects.filter(kind="key_destroyed").exists()
    assert DiskKey.objects.get(lease=lease).state == DiskKey.State.DESTROY_REQUESTED

    widest = [{"argv": erase, "exit": exit} for exit in (-(2**31), 2**31, -9, 255)]
    widest += [{"argv": erase, "exit": 0}] * (100 - len(widest))
    record = signed(node, key_destroyed(node, lease, test_exit=255), commands=widest)
    assert node.report(evidence=[record]).json() == {"accepted": ["evidence[0]"], "refused": []}
    assert DiskKey.objects.get(lease=lease).state == DiskKey.State.DESTROYED
