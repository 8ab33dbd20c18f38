"""The agent's waits (nodeagent/agent.py): its round's report is the report that waits for a
change (`_report`), and between rounds (`_until_next_round`) it asks the storefront to answer
a change at once; each falls back to the plain report and the plain poll when the storefront
predates it, does not answer, or the last round failed."""
import time

import pytest

from nodeagent.agent import MIN_ROUND_GAP_SECONDS, Agent
from nodeagent.client import StorefrontRefused, StorefrontUnreachable


class Stop:
    def __init__(self, stopped=False):
        self.waited, self.stopped = [], stopped

    def wait(self, seconds):
        self.waited.append(seconds)
        return self.stopped

    def is_set(self):
        return self.stopped


class Client:
    def __init__(self, answer, version="e.v", until=None):
        self.answer, self.desired_version, self.asked, self.until = answer, version, [], until

    def watch(self, version, wait):
        self.asked.append((version, wait))
        if self.until is not None:
            self.until.wait(30)
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def agent_with(client, *, watching=True, failures=0):
    agent = Agent.__new__(Agent)       # the loop's state only: no state dir, no runtime
    agent.client, agent.watching, agent.failures, agent._held = client, watching, failures, {"held": 1}
    return agent


def test_a_change_starts_the_next_round_at_once_with_the_document_fetched_afresh():
    agent, stop = agent_with(Client(True)), Stop()
    agent._round_started = time.monotonic() - 3       # the last round began 3 s ago
    agent._until_next_round(15, stop)
    assert agent.client.asked == [("e.v", pytest.approx(15, abs=0.1))]
    assert stop.waited == [] and agent._held is None


def test_rounds_started_by_changes_are_spaced_by_the_minimum_gap():
    agent, stop = agent_with(Client(True)), Stop()
    agent._round_started = time.monotonic()            # a round that began just now
    agent._until_next_round(15, stop)
    assert len(stop.waited) == 1 and 0 < stop.waited[0] <= MIN_ROUND_GAP_SECONDS


class CappedClient(Client):
    """A storefront that holds each wait `held` seconds at most, then says "unchanged"."""

    def __init__(self, held):
        super().__init__(False)
        self.held = held

    def watch(self, version, wait):
        super().watch(version, wait)
        time.sleep(min(wait, self.held))
        return False


def test_a_wait_the_storefront_cut_short_is_asked_again_for_the_rest_of_the_interval():
    """The storefront caps a wait (NODE_WATCH_MAX_SECONDS) below a long poll interval: the
    agent watches again for what is left, and sleeps only a rest under a second."""
    agent, stop = agent_with(CappedClient(held=1.6)), Stop()
    agent._until_next_round(3.0, stop)
    asked = [wait for _version, wait in agent.client.asked]
    assert len(asked) == 2 and asked[0] == pytest.approx(3.0, abs=0.1) and asked[1] < asked[0]
    assert agent._held == {"held": 1} and len(stop.waited) == 1 and stop.waited[0] <= 1.0


def test_a_storefront_that_answers_at_once_is_not_asked_again_and_again():
    """A WSGI server answers "unchanged" without holding (NODE_WATCH_WSGI_HOLD_SECONDS 0):
    asking again would be a busy loop, so the agent sleeps out its interval."""
    agent, stop = agent_with(CappedClient(held=0.0)), Stop()
    agent._until_next_round(15, stop)
    assert len(agent.client.asked) == 1
    assert len(stop.waited) == 1 and 14 < stop.waited[0] <= 15


@pytest.mark.parametrize("error, still_watching", [
    (StorefrontRefused(404, "not_found"), False),          # a storefront that predates the watch
    (StorefrontRefused(405, "method_not_allowed"), False),
    (StorefrontRefused(429, "rate_limited"), True),
    (StorefrontUnreachable("GET /agent/v1/desired/watch: timeout"), True),
])
def test_a_refused_or_unanswered_watch_falls_back_to_the_poll(error, still_watching):
    agent, stop = agent_with(Client(error)), Stop()
    agent._until_next_round(15, stop)
    assert agent.watching is still_watching and agent._held == {"held": 1}
    assert len(stop.waited) == 1 and 14 < stop.waited[0] <= 15


@pytest.mark.parametrize("agent", [
    agent_with(Client(True), watching=False),     # turned off (config `watch = false`, or a 404)
    agent_with(Client(True), failures=2),         # backing off: no watch while the storefront fails
    agent_with(Client(True, version="")),         # a storefront without versions
], ids=["not-watching", "backing-off", "no-version"])
def test_without_a_watch_the_agent_sleeps_the_delay(agent):
    stop = Stop()
    agent._until_next_round(40, stop)
    assert agent.client.asked == [] and stop.waited == [40]


def test_a_stop_ends_a_held_watch_at_once():
    """SIGTERM (an upgrade, systemd) while the storefront holds the watch: the loop returns
    without waiting for the answer, and without treating the abandoned call as an answer."""
    import threading

    never = threading.Event()
    agent = agent_with(Client(True, until=never))
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    started = time.monotonic()
    agent._until_next_round(60, stop)
    assert time.monotonic() - started < 10 and agent._held == {"held": 1}
    never.set()


class ReportClient:
    """The report as the client sends it: with `wait_from` (the report that waits) or not."""

    def __init__(self, answers, version="e.v", until=None):
        self.answers, self.desired_version, self.sent, self.until = list(answers), version, [], until

    def report(self, report, key, wait_from=None):
        self.sent.append(wait_from)
        if wait_from is not None and self.until is not None:
            self.until.wait(30)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def reporting_agent(client, *, watching=True, started_ago=3.0, stop=None):
    agent = agent_with(client, watching=watching)
    agent.key, agent.poll_seconds, agent.reports_wait, agent._stop = "key", 15.0, True, stop
    agent._round_started, agent._report_waited = time.monotonic() - started_ago, False
    return agent


def test_a_watching_node_sends_the_report_that_waits_for_the_rest_of_its_interval():
    agent = reporting_agent(ReportClient([{"desired": None}]), started_ago=3.0)
    assert agent._report({"seq": 1}) == {"desired": None}
    [(version, wait)] = agent.client.sent
    assert version == "e.v" and 15 - (time.monotonic() - agent._round_started) <= wait <= 12
    assert agent._report_waited is True


@pytest.mark.parametrize("agent", [
    reporting_agent(ReportClient([{}]), watching=False),           # config `watch = false`, or a 404
    reporting_agent(ReportClient([{}], version="")),               # a storefront without versions
    reporting_agent(ReportClient([{}]), started_ago=14.5),         # under a second of the interval left
], ids=["not-watching", "no-version", "interval-spent"])
def test_otherwise_the_report_is_sent_plain(agent):
    assert agent._report({"seq": 1}) == {}
    assert agent.client.sent == [None] and agent._report_waited is False


def test_a_storefront_that_predates_it_gets_the_plain_report_now_and_from_then_on():
    client = ReportClient([StorefrontRefused(404, "not_found"), {"plain": 1}, {"plain": 2}])
    agent = reporting_agent(client)
    assert agent._report({"seq": 1}) == {"plain": 1}       # the same report: it was not taken
    assert agent._report({"seq": 2}) == {"plain": 2}
    assert client.sent[1:] == [None, None] and client.sent[0] is not None and agent.reports_wait is False


@pytest.mark.parametrize("error", [StorefrontRefused(429, "rate_limited"), StorefrontUnreachable("timeout")])
def test_a_held_report_refused_or_unanswered_fails_the_round_as_a_report_does(error):
    agent = reporting_agent(ReportClient([error]))
    with pytest.raises(type(error)):
        agent._report({"seq": 1})
    assert agent.reports_wait is True


def test_a_stop_ends_a_held_report_at_once():
    """SIGTERM while the storefront holds the report: the round ends without its answer (the
    report was taken; its evidence and telemetry are sent again from the outbox)."""
    import threading

    never, stop = threading.Event(), threading.Event()
    agent = reporting_agent(ReportClient([{"desired": None}], until=never), stop=stop)
    threading.Timer(0.3, stop.set).start()
    started = time.monotonic()
    assert agent._report({"seq": 1}) is None
    assert time.monotonic() - started < 10 and agent._report_waited is False
    never.set()
