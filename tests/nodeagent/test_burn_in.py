"""The agent's burn-in: `dcgmi diag` through a stub that answers as DCGM does,
the fallback command, and the worker thread that signs a record per request without
holding up the loop. The storefront side is tests/fleet/test_burn_in.py; the real agent
against the live storefront is test_burn_in_agent.py."""
import json
import threading

from nodeagent.burnin import BurnInConfig, Diagnostics, parse_dcgmi
from nodeagent.signing import canonical_json

from .helpers import DCGMI, Cards, runner, wait_idle


def test_dcgmi_output_is_read_test_by_test():
    output = json.dumps({"version": "3.3.5", "DCGM GPU Diagnostic": {"test_categories": [
        {"category": "Hardware", "tests": [
            {"name": "GPU Memory", "results": [{"gpu_id": "0", "status": "Fail", "info": "bad"}]},
            {"name": "Diagnostic", "results": [{"gpu_id": "0", "status": "Warn"}]}]}]}})
    version, tests = parse_dcgmi(output)
    assert version == "3.3.5"
    assert [(t["name"], t["status"]) for t in tests] == [("GPU Memory", "fail"), ("Diagnostic", "warn")]
    assert tests[0]["info"] == "bad"


def test_the_stub_dcgmi_passes_and_fails_by_gpu(monkeypatch):
    monkeypatch.setenv("DCGMI_STUB_FAIL", "1")
    diagnostics = Diagnostics(BurnInConfig(dcgmi=DCGMI))
    good = diagnostics.diagnose(index=0, uuid="GPU-0", level=2)
    bad = diagnostics.diagnose(index=1, uuid="GPU-1", level=2)
    assert good.passed and good.tool == "dcgmi" and good.tool_version == "3.3.5"
    assert {t["name"]: t["status"] for t in good.tests}["PCIe"] == "skip"
    assert not bad.passed and bad.detail == "GPU Memory"


def test_without_dcgmi_the_fallback_command_decides_and_without_either_the_card_fails(tmp_path):
    script = tmp_path / "burn"
    script.write_text('#!/bin/sh\n[ "$1" = "GPU-7" ] && echo \'{"tests": [{"name": "matmul", "status": "pass"},'
                      ' {"name": "memory pattern", "status": "pass"}]}\' && exit 0\nexit 1\n')
    script.chmod(0o755)
    fallback = Diagnostics(BurnInConfig(dcgmi="no-such-dcgmi", fallback_command=[str(script), "{uuid}"]))
    good = fallback.diagnose(index=7, uuid="GPU-7", level=2)
    assert good.passed and good.tool == "fallback" and [t["name"] for t in good.tests] == ["matmul", "memory pattern"]
    assert not fallback.diagnose(index=3, uuid="GPU-3", level=2).passed
    nothing = Diagnostics(BurnInConfig(dcgmi="no-such-dcgmi")).diagnose(index=0, uuid="GPU-0", level=2)
    assert not nothing.passed and nothing.tool == "none"


def test_each_request_becomes_one_signed_record_and_is_not_run_twice(tmp_path, monkeypatch):
    log = tmp_path / "calls"
    monkeypatch.setenv("DCGMI_STUB_LOG", str(log))
    monkeypatch.setenv("DCGMI_STUB_FAIL", "1")
    r, key, outbox = runner(tmp_path, Diagnostics(BurnInConfig(dcgmi=DCGMI)))
    requests = [{"op_id": "burnin:1:1", "gpu": 0, "level": 3}, {"op_id": "burnin:2:1", "gpu": 1, "level": 3}]
    r.submit(requests, busy_gpus=set())
    wait_idle(r)
    r.submit(requests, busy_gpus=set())         # the storefront asks again before the report lands
    wait_idle(r)
    records = outbox.pending()
    assert [(x["op_id"], x["result"]) for x in records] == [("burnin:1:1", "pass"), ("burnin:2:1", "fail")]
    assert log.read_text().splitlines() == ["diag -r 3 -j -i 0", "diag -r 3 -j -i 1"]
    first = records[0]
    assert first["kind"] == "burn_in" and first["gpu_uuid"] == "GPU-0" and first["tool"] == "dcgmi"
    assert first["counters_before"] == first["counters_after"]
    import base64

    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    public = Ed25519PublicKey.from_public_bytes(base64.b64decode(key.public_key_b64()))
    unsigned = {k: v for k, v in first.items() if k != "signature"}
    public.verify(base64.b64decode(first["signature"]), canonical_json(unsigned))   # raises if forged


def test_a_gpu_in_use_is_never_diagnosed(tmp_path, monkeypatch):
    log = tmp_path / "calls"
    monkeypatch.setenv("DCGMI_STUB_LOG", str(log))
    r, _, outbox = runner(tmp_path, Diagnostics(BurnInConfig(dcgmi=DCGMI)))
    r.submit([{"op_id": "burnin:1:1", "gpu": 0, "level": 2}], busy_gpus={0})
    wait_idle(r)
    assert outbox.pending() == [] and not log.exists()


def test_counters_that_move_during_the_test_fail_it(tmp_path):
    cards = Cards()

    class Moving(Diagnostics):
        def diagnose(self, *, index, **kwargs):
            cards.readings[index]["ecc_uncorrected"] = 2      # the test itself hit memory errors
            return super().diagnose(index=index, **kwargs)

    r, _, outbox = runner(tmp_path, Moving(BurnInConfig(dcgmi=DCGMI)), probe=cards)
    r.submit([{"op_id": "burnin:5:1", "gpu": 1, "level": 1}], busy_gpus=set())
    wait_idle(r)
    [record] = outbox.pending()
    assert record["result"] == "fail" and "counters moved" in record["detail"]
    assert record["counters_before"]["ecc_uncorrected"] == 0 and record["counters_after"]["ecc_uncorrected"] == 2


def test_a_slow_diagnostic_does_not_hold_up_the_caller(tmp_path):
    release = threading.Event()

    class Slow(Diagnostics):
        def diagnose(self, **kwargs):
            release.wait(30)
            return super().diagnose(**kwargs)

    r, _, outbox = runner(tmp_path, Slow(BurnInConfig(dcgmi=DCGMI)))
    r.submit([{"op_id": "burnin:9:1", "gpu": 0, "level": 3}], busy_gpus=set())   # returns at once
    assert not r.idle() and outbox.pending() == []
    release.set()
    wait_idle(r)
    assert [x["result"] for x in outbox.pending()] == ["pass"]
