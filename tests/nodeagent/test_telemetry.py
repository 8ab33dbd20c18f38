"""GPU telemetry on the node (nodeagent/telemetry.py): the readings through the real
nvidia-ml-py code path against the stub libnvidia-ml, the bounded buffer, what a report
carries and when the agent drops it (PROTOCOL.md, "Telemetry")."""
import json
import os
import subprocess
import sys

import pytest

from nodeagent.agent import Agent
from nodeagent.client import StorefrontRefused, StorefrontUnreachable
from nodeagent.config import AgentConfig, ConfigError, parse_config
from nodeagent.gpu import NoGpuProbe
from nodeagent.signing import NodeKey
from nodeagent.state import StateDir, write_json
from nodeagent.telemetry import Telemetry

from .no_instances import NoInstances

T0 = 29_000_000 * 60          # a minute boundary (unix seconds)

SAMPLER = """
import json, os, sys
from pathlib import Path
from nodeagent.gpu import open_gpu_probe
from nodeagent.telemetry import Telemetry
probe = open_gpu_probe()
t = Telemetry(probe, Path(sys.argv[1]))
t.sample(T0)
Path(os.environ["NVML_STUB_FAULTS"]).write_text("NVML_STUB_UTIL=97\\nNVML_STUB_ECC_CORRECTED=5\\n")
t.sample(T0 + 60)
print(json.dumps({"batch": t.batch()}))
""".replace("T0", str(T0))


def test_readings_through_nvml(nvml_stub, tmp_path):
    faults = tmp_path / "faults"
    faults.write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVML_STUB_")}
    env.update(LD_LIBRARY_PATH=str(nvml_stub), NVML_STUB_GPUS="2", NVML_STUB_UTIL="12",
               NVML_STUB_MEM_USED_MB="40960", NVML_STUB_POWER_MW="312400", NVML_STUB_SM_MHZ="1755",
               NVML_STUB_TEMP="55", NVML_STUB_XID="1:79", NVML_STUB_FAULTS=str(faults))
    run = subprocess.run([sys.executable, "-c", SAMPLER, str(tmp_path / "t.json")], env=env,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    batch = json.loads(run.stdout)["batch"]
    assert batch["start"] == T0 // 60
    assert batch["samples"] == [[0, 0, 12, 40960, 55, 312, 1755], [0, 1, 12, 40960, 55, 312, 1755],
                                [1, 0, 97, 40960, 55, 312, 1755], [1, 1, 97, 40960, 55, 312, 1755]]
    # the Xid event once, in the minute it arrived; the corrected ECC counter as its growth
    assert batch["events"] == [[0, 1, "xid", 79, 1], [1, 0, "ecc", 5, 0], [1, 1, "ecc", 5, 0]]


class FakeProbe:
    """The probe's `telemetry()` for the buffer's own rules (readings set by the test)."""

    def __init__(self, cards=8):
        self.cards, self.util, self.xids, self.ecc = cards, 50, {}, 0

    def telemetry(self):
        return [{"index": i, "util": self.util, "mem_mb": 70000 + i, "temp_c": 60, "power_w": 650,
                 "sm_mhz": 1980, "ecc_corrected": self.ecc, "ecc_uncorrected": 0,
                 "xids": self.xids.pop(i, [])} for i in range(self.cards)]


def accepted():
    return {"accepted": ["telemetry"], "refused": []}


def test_one_sample_per_card_per_minute(tmp_path):
    t = Telemetry(FakeProbe(), tmp_path / "t.json")
    assert t.sample(T0) and not t.sample(T0 + 59) and t.sample(T0 + 60)
    assert t.pending() == 16


def test_unanswered_report_keeps_samples_and_answered_drops_them(tmp_path):
    t = Telemetry(FakeProbe(cards=2), tmp_path / "t.json")
    t.sample(T0)
    first = t.batch()
    t.settle(None)                             # the report was lost: nothing dropped
    assert t.batch() == first
    t.sample(T0 + 60)                          # a new minute while the report was out
    t.settle(accepted())                       # only what that report carried goes
    left = t.batch()
    assert left["start"] == T0 // 60 + 1 and [r[1] for r in left["samples"]] == [0, 1]
    t.settle({"accepted": [], "refused": [{"item": "telemetry", "error": "invalid"}]})
    assert t.batch() is None                   # refused for good: resending cannot help


def test_buffer_survives_a_restart_and_is_bounded(tmp_path):
    path = tmp_path / "t.json"
    t = Telemetry(FakeProbe(), path, max_samples=8 * 60)
    for m in range(90):                        # 90 minutes without a storefront
        t.sample(T0 + 60 * m)
    assert t.pending() == 8 * 60 and t.dropped == 8 * 30
    again = Telemetry(FakeProbe(), path, max_samples=8 * 60)
    assert again.pending() == 8 * 60
    assert again.batch()["start"] == T0 // 60 + 30       # the newest hour kept
    assert not again.sample(T0 + 60 * 89)                # that minute was sampled before the restart
    assert path.stat().st_size < 40_000


def test_per_poll_size_bound(tmp_path):
    """A day of 8 cards waiting (an outage) drains at most `per_report` samples per report:
    each report's field stays a few kB; at 1-minute resolution a steady poll carries one
    minute (8 samples), a few hundred bytes."""
    t = Telemetry(FakeProbe(), tmp_path / "t.json", max_samples=8 * 1440)
    for m in range(1440):
        t.sample(T0 + 60 * m)
    sizes = []
    while (batch := t.batch()) is not None:
        sizes.append(len(json.dumps(batch, separators=(",", ":"))))
        t.settle(accepted())
    assert len(sizes) == 8 * 1440 // 120
    assert max(sizes) <= 4000, max(sizes)
    for m in range(1440, 1445):               # steady: five minutes of 8 cards in one report
        t.sample(T0 + 60 * m)
    steady = len(json.dumps(t.batch(), separators=(",", ":")))
    assert steady <= 1400, steady
    print(f"telemetry per report: backlog {max(sizes)} B, steady {steady} B")


def test_xid_storm_and_ecc_reset(tmp_path):
    probe = FakeProbe(cards=1)
    t = Telemetry(probe, tmp_path / "t.json")
    probe.ecc = 7
    t.sample(T0)                               # baseline: no event
    probe.xids = {0: [13, 13, 13, 31]}
    probe.ecc = 9
    t.sample(T0 + 60)
    probe.ecc = 2                              # the driver reloaded: counters restarted
    t.sample(T0 + 120)
    m = T0 // 60
    assert t.events == [[m + 1, 0, "xid", 13, 3], [m + 1, 0, "xid", 31, 1], [m + 1, 0, "ecc", 2, 0],
                        [m + 2, 0, "ecc", 2, 0]]


@pytest.mark.parametrize("raw", [{"telemetry_seconds": 30}, {"telemetry_seconds": True},
                                 {"telemetry_samples_per_report": 0}, {"telemetry_buffer_samples": "x"}])
def test_bad_telemetry_config_is_refused(raw):
    with pytest.raises(ConfigError):
        parse_config({"state_dir": "/tmp/x", **raw})


def test_telemetry_off():
    assert parse_config({"state_dir": "/tmp/x", "telemetry_seconds": 0}).telemetry_seconds == 0


class CardsProbe(NoGpuProbe):
    """No inventory, but readings: the agent's loop with telemetry and nothing else."""

    def telemetry(self):
        return FakeProbe(cards=2).telemetry()


def test_the_agent_sends_telemetry_until_a_report_is_answered(tmp_path):
    state = StateDir(tmp_path)
    state.ensure()
    NodeKey.generate(state.key_path)
    write_json(state.enrolment_path, {"url": "http://127.0.0.1:9", "node": "n", "credential": "c",
                                      "poll_seconds": 15})
    agent = Agent(AgentConfig(storefront_url="http://127.0.0.1:9", state_dir=tmp_path, public_host="203.0.113.7"),
                  runtime=NoInstances(), disks=NoInstances(), probe=CardsProbe("test"))
    agent.telemetry.sample(T0)
    sent, answers = [], iter([StorefrontUnreachable("down"), StorefrontRefused(409, "replayed"),
                              {"accepted": ["telemetry"], "refused": []}, {"accepted": [], "refused": []}])

    def report(body, key):
        sent.append(body)
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    agent.client.report = report
    for _ in range(2):
        with pytest.raises((StorefrontUnreachable, StorefrontRefused)):
            agent._send_report([], [])
    agent._send_report([], [])
    agent._send_report([], [])
    assert [len(b.get("telemetry", {}).get("samples", [])) for b in sent] == [2, 2, 2, 0]
    assert sent[0]["telemetry"] == sent[2]["telemetry"]          # the same samples until answered


def test_samples_wait_until_the_oldest_is_send_minutes_old(tmp_path):
    now = [T0]
    t = Telemetry(FakeProbe(cards=2), tmp_path / "t.json", send_minutes=5, per_report=6, clock=lambda: now[0])
    for m in range(2):
        now[0] = T0 + 60 * m
        t.sample()
        assert t.batch() is None                # young, and it fits one report
    now[0] = T0 + 60 * 5
    assert len(t.batch()["samples"]) == 4       # the oldest is 5 minutes old: all sent
    t.settle(accepted())
    for m in range(6, 9):                        # 6 samples waiting fill a report: sent at once
        now[0] = T0 + 60 * m
        t.sample()
    assert len(t.batch()["samples"]) == 6
