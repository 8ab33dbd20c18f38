"""The agent's interval is the storefront's (nodeagent/agent.py `run_once`): a larger fleet is
told a longer one (fleet/pacing.py), and the next round follows the document it converged to."""
from types import SimpleNamespace

from nodeagent.agent import Agent


def agent_told(*documents: dict) -> Agent:
    """An agent whose storefront gives `documents` in turn: the first from its GET, each next
    one in the answer to the report after converging to the one before."""
    agent = Agent.__new__(Agent)        # the loop's state only: no state dir, no runtime
    agent.poll_seconds, agent.failures, agent._held = 15.0, 0, None
    answers = iter(documents[1:])
    agent.client = SimpleNamespace(desired=lambda: documents[0], desired_from=lambda answer: answer["desired"])
    agent.converger = SimpleNamespace(runtime=SimpleNamespace(guard=lambda: None), converge=lambda *args: [])
    agent.attachment = SimpleNamespace(apply=lambda inventory, runtime: [])
    agent.probe = SimpleNamespace(inventory=lambda: [])
    agent.burn_in = SimpleNamespace(submit=lambda *args, **kwargs: None)
    agent._send_report = lambda gpus, instances: {"desired": next(answers, None)}
    return agent


def test_the_next_round_comes_after_the_interval_the_document_says():
    agent = agent_told({"poll_seconds": 45, "instances": []})
    assert agent.run_once() == 45 and agent.poll_seconds == 45


def test_a_new_interval_in_a_report_answer_paces_the_next_round():
    first, longer = {"poll_seconds": 15, "instances": []}, {"poll_seconds": 60, "instances": []}
    agent = agent_told(first, longer)
    assert agent.run_once() == 60
    assert agent._held is None          # the last answer said the document is current
