"""A node's signed `burn_in` record (PROTOCOL.md, "Evidence records"): it counts only for a
burn-in the storefront asked of that node for that card, once; the signature is checked
with the node's key over the canonical JSON and the record is kept verbatim beside the
result (inventory.burnin.burn_in_record applies it)."""
from datetime import datetime

from inventory.burnin import burn_in_record
from inventory.models import BurnIn

from .crypto import canonical_json, signature_valid
from .evidence import Refused, int_field, str_field
from .models import NodeAgent
from .timeutil import parse_time

MAX_TESTS = 100


def _check_tests(record: dict) -> None:
    tests = record.get("tests")
    if not isinstance(tests, list) or len(tests) > MAX_TESTS:
        raise Refused("invalid")
    for test in tests:
        if not isinstance(test, dict) or not isinstance(test.get("name"), str) or \
                test.get("status") not in ("pass", "fail", "warn", "skip"):
            raise Refused("invalid")


def burn_in_accept(*, agent: NodeAgent, record, now: datetime) -> BurnIn:
    if not isinstance(record, dict):
        raise Refused("invalid")
    op_id = str_field(record.get("op_id"), 80)
    index = int_field(record.get("gpu_index"), 0, 63)
    signature = str_field(record.get("signature"), 120)
    at = parse_time(record.get("at"))
    if at is None or record.get("result") not in ("pass", "fail"):
        raise Refused("invalid")
    if record.get("node") != agent.node.name:
        raise Refused("wrong_node")
    if not signature_valid(public_key=agent.public_key, signature=signature, message=canonical_json(record)):
        raise Refused("bad_signature")
    _check_tests(record)
    burn_in = BurnIn.objects.select_related("slot").filter(op_id=op_id, slot__node=agent.node).first()
    if burn_in is None or burn_in.slot.index != index:
        raise Refused("not_requested")
    if burn_in.finished_at is not None:
        if burn_in.signature != signature:
            raise Refused("conflicting_evidence")
        return burn_in            # sent again: the agent resends until accepted
    unsigned = {k: v for k, v in record.items() if k != "signature"}
    return burn_in_record(burn_in=burn_in, passed=record["result"] == "pass", record=unsigned,
                          signature=signature, signed_text=canonical_json(record).decode(),
                          at=min(at, now), now=now)
