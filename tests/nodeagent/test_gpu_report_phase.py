"""An agent sends its GPUs in its first report and then at least every 20th, and
where that cycle starts is its own, so a fleet restarted together does not send its
costliest reports in the same poll interval forever."""
import itertools
import random
from dataclasses import replace

from nodeagent.agent import FULL_GPU_REPORT_EVERY, Agent
from nodeagent.config import AgentConfig
from nodeagent.gpu import NoGpuProbe
from nodeagent.interfaces import GpuInfo
from nodeagent.signing import NodeKey
from nodeagent.state import StateDir, write_json

from .no_instances import NoInstances

REPORTS = 70



def _agent(root) -> Agent:
    state = StateDir(root)
    state.ensure()
    NodeKey.generate(state.key_path)
    write_json(state.enrolment_path, {"url": "http://127.0.0.1:9", "node": root.name, "credential": "c",
                                      "poll_seconds": 15})
    return Agent(AgentConfig(storefront_url="http://127.0.0.1:9", state_dir=root, public_host="203.0.113.7"),
                 runtime=NoInstances(), disks=NoInstances(), probe=NoGpuProbe("test"))


def _reports_with_gpus(agent: Agent) -> list[int]:
    """The indexes, among REPORTS accepted reports of unchanged GPUs, of those carrying them."""
    sent = []
    agent.client.report = lambda report, key: sent.append(report) or {"accepted": [], "refused": []}
    for _ in range(REPORTS):
        agent._send_report([], [])
    return [i for i, report in enumerate(sent) if "gpus" in report]


def test_a_restarted_fleet_spreads_its_full_gpu_reports(tmp_path):
    random.seed(31)
    fleet = [_reports_with_gpus(_agent(tmp_path / f"node{n}")) for n in range(40)]
    for full in fleet:
        assert full[0] == 0                                        # the first report after a start
        gaps = [b - a for a, b in itertools.pairwise(full)]
        assert 2 <= gaps[0] <= FULL_GPU_REPORT_EVERY + 1           # after 1 to 20 without
        assert set(gaps[1:]) == {FULL_GPU_REPORT_EVERY + 1}        # then never more than 20 without
    # Forty nodes started together: their second full reports fall in many different intervals.
    assert len({full[1] for full in fleet}) >= 12


def test_changed_gpus_are_sent_at_once_whatever_the_phase(tmp_path):
    agent = _agent(tmp_path / "node")
    sent = []
    agent.client.report = lambda report, key: sent.append(report) or {"accepted": [], "refused": []}
    gpu = GpuInfo(index=0, uuid="GPU-1", name="H100", memory_mb=81559, driver="550", cuda="12.4",
                  temperature_c=40, ecc_uncorrected=0, xid_errors=(), healthy=True)
    agent._send_report([gpu], [])
    agent._send_report([replace(gpu, temperature_c=71)], [])     # a temperature alone: not a change
    agent._send_report([replace(gpu, healthy=False, problem="xid 79")], [])
    assert ["gpus" in report for report in sent] == [True, False, True]
    assert sent[2]["gpus"][0]["healthy"] is False
