"""`gpu-rent verify-record` (cli/gpu_rent/verify.py): a customer checks a sanitization record
offline against the node key fingerprint given at lease start, and is told plainly what was
and was not proven. Records are signed here by the node agent's own signing code; the CLI's
verifier imports nothing of it, and a Hypothesis property holds it to the same verdicts as
the agent's `verify_record`."""
import json
import sys
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nodeagent.records import verify_record as agent_verify
from nodeagent.signing import NodeKey, canonical_json

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "cli"))

from gpu_rent import verify  # noqa: E402
from gpu_rent.main import main  # noqa: E402

LEASE = 41


def proof(key: NodeKey, facts: dict) -> dict:
    signed = canonical_json(facts).decode()
    return {"kind": facts["kind"], "node": facts["node"], "disk": "lease", "public_key": key.public_key_b64(),
            "signed": signed, "signature": key.sign(signed.encode())}


def facts(kind: str, node="gpu-a1") -> dict:
    base = {"kind": kind, "node": node, "lease_id": LEASE, "luks_uuid": "c0ffee", "at": "2026-12-05T03:00:00Z"}
    if kind == "key_destroyed":
        return {**base, "keyslots_after": 0, "test_passphrase_exit": 2}
    return {**base, "result": "ok", "method": "sanitize-crypto", "device_model": "SAMSUNG MZ1L2",
            "device_serial": "S6X1", "verification": {"samples": 3000, "nonzero": 0, "confidence": {
                "statement": "a residue on 0.100% or more of the disk's blocks would have been found with 95% "
                             "confidence (2997 random blocks)"}}}


def record(*proofs) -> dict:
    return {"format": verify.FORMAT, "lease_id": LEASE, "proofs": list(proofs)}


def run(tmp_path, capsys, document, *args) -> tuple[int, str]:
    path = tmp_path / "record.json"
    path.write_text(json.dumps(document))
    code = main(["verify-record", str(path), *args])
    return code, capsys.readouterr().out


def test_a_record_checked_against_the_given_fingerprint_proves_who_signed_it(tmp_path, capsys):
    key = NodeKey.generate(tmp_path / "node.pem")
    doc = record(proof(key, facts("key_destroyed")), proof(key, facts("disk_wiped")))
    printed = verify.fingerprint(key.public_key_b64())
    assert printed.startswith("SHA256:") and len(printed) == 7 + 43
    code, out = run(tmp_path, capsys, doc, "--node-key-fingerprint", printed)
    assert code == verify.EXIT_OK
    assert "Proven: those proofs were signed by a node key whose fingerprint you gave" in out
    assert "95% confidence" in out and "NOT proven" not in out
    # the whole key is accepted in place of its fingerprint
    assert run(tmp_path, capsys, doc, "--node-key-fingerprint", key.public_key_b64())[0] == verify.EXIT_OK


def test_without_a_fingerprint_the_signer_is_said_to_be_unproven(tmp_path, capsys):
    key = NodeKey.generate(tmp_path / "node.pem")
    code, out = run(tmp_path, capsys, record(proof(key, facts("key_destroyed")), proof(key, facts("disk_wiped"))))
    assert code == verify.EXIT_SIGNER_UNPROVEN
    assert "NOT proven: who signed them" in out


def test_a_record_signed_by_another_key_or_changed_after_signing_fails(tmp_path, capsys):
    node, forger = NodeKey.generate(tmp_path / "node.pem"), NodeKey.generate(tmp_path / "forger.pem")
    given = verify.fingerprint(node.public_key_b64())
    forged = record(proof(forger, facts("key_destroyed")), proof(forger, facts("disk_wiped")))
    code, out = run(tmp_path, capsys, forged, "--node-key-fingerprint", given)
    assert code == verify.EXIT_BAD and "not one you were given" in out
    changed = proof(node, facts("disk_wiped"))
    changed["signed"] = changed["signed"].replace('"nonzero":0', '"nonzero":1')
    code, out = run(tmp_path, capsys, record(proof(node, facts("key_destroyed")), changed),
                    "--node-key-fingerprint", given)
    assert code == verify.EXIT_BAD and "FAILED  disk_wiped: signature does not check out" in out


def test_a_destroyed_key_without_its_wipe_proof_is_named_missing(tmp_path, capsys):
    key = NodeKey.generate(tmp_path / "node.pem")
    code, out = run(tmp_path, capsys, record(proof(key, facts("key_destroyed"))),
                    "--node-key-fingerprint", verify.fingerprint(key.public_key_b64()))
    assert code == verify.EXIT_NO_WIPE_PROOF
    assert "MISSING" in out and "NOT proven: that every disk whose key was destroyed was wiped" in out


def test_what_is_no_record_fails_with_a_clear_message(tmp_path, capsys):
    code, out = run(tmp_path, capsys, {"hello": 1})
    assert code == verify.EXIT_BAD and "not a sanitization record" in out
    assert main(["verify-record", str(tmp_path / "absent.json")]) == verify.EXIT_BAD
    assert "cannot read" in capsys.readouterr().err


_KEYS: dict[str, NodeKey] = {}


def _key(tmp_path_factory, name: str) -> NodeKey:
    if name not in _KEYS:
        _KEYS[name] = NodeKey.generate(tmp_path_factory.mktemp(name) / "key.pem")
    return _KEYS[name]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kinds=st.lists(st.sampled_from(["key_destroyed", "disk_wiped"]), min_size=1, max_size=4),
       signers=st.lists(st.sampled_from(["node", "forger"]), min_size=4, max_size=4),
       tamper=st.lists(st.sampled_from([None, "signed", "lease", "result"]), min_size=4, max_size=4))
def test_the_cli_and_the_agent_verifiers_agree(tmp_path_factory, kinds, signers, tamper):
    node = _key(tmp_path_factory, "node")
    proofs = []
    for i, kind in enumerate(kinds):
        f = facts(kind)
        if tamper[i] == "lease":
            f["lease_id"] = LEASE + 1
        if tamper[i] == "result" and kind == "disk_wiped":
            f["result"] = "failed"
        p = proof(_key(tmp_path_factory, signers[i]), f)
        if tamper[i] == "signed":
            p["signed"] = p["signed"].replace("gpu-a1", "gpu-a2")
        proofs.append(p)
    doc = record(*proofs)
    cli = verify.verify(doc, [verify.fingerprint(node.public_key_b64())])
    agent = agent_verify(doc, node_key=node.public_key_b64())
    assert [(r.kind, r.ok, r.missing) for r in cli] == [(r.kind, r.ok, r.missing) for r in agent]
