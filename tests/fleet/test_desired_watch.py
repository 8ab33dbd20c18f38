"""GET /agent/v1/desired/watch (fleet/desired_watch.py): a node that holds version V is
answered as soon as its desired state moves past V — by the bump of a committed change,
not by the periodic recheck — or after `wait` seconds with `changed: false`. Under WSGI it
is answered at once (a server thread is not parked)."""
import json
import time

import pytest
from asgiref.sync import async_to_sync
from django.test import AsyncRequestFactory
from django.utils import timezone

from fleet import desired_watch, views
from fleet.desired_version import desired_changed

from .conftest import leaseless_agent, node_of
from .waits import held, in_own_thread

pytestmark = pytest.mark.django_db(transaction=True)   # changes announce on commit


def version_of(node) -> str:
    response = node.desired()
    assert response.status_code == 200
    return response[views.VERSION_HEADER]


def watch_over_wsgi(node, **params):
    return in_own_thread(lambda: node.client.get("/agent/v1/desired/watch", params, **node.auth))


def held_watch(node, *, version: str, wait: float, while_waiting=None) -> tuple[dict, float]:
    """The watch as the ASGI process serves it, `while_waiting` run once it waits."""
    request = AsyncRequestFactory().get("/agent/v1/desired/watch", {"version": version, "wait": wait},
                                        headers={"Authorization": f"Node {node.credential}"})
    response, took = held(views.watch, request, while_waiting=while_waiting)
    assert response.status_code == 200, response.content
    return json.loads(response.content), took


def test_every_desired_answer_says_its_version_and_a_change_moves_it(paid_lease, enrol):
    lease = paid_lease()
    node = enrol(node_of(lease))
    first = version_of(node)
    assert first and version_of(node) == first
    report = node.post(node.body(desired_etag=""))
    assert report.status_code == 200 and report[views.VERSION_HEADER] == first
    desired_changed([node.node.pk])
    assert version_of(node) != first


def test_a_node_behind_is_answered_at_once_and_one_up_to_date_is_not_held_under_wsgi(paid_lease, enrol, settings):
    settings.NODE_WATCH_WSGI_HOLD_SECONDS = 0
    lease = paid_lease()
    node = enrol(node_of(lease))
    version = version_of(node)
    behind = watch_over_wsgi(node, version="0.0", wait=30)
    assert behind.status_code == 200 and behind.json() == {"changed": True, "version": version}
    started = time.monotonic()
    current = watch_over_wsgi(node, version=version, wait=30)
    assert current.json() == {"changed": False, "version": version}
    assert time.monotonic() - started < 25          # not held for the 30 s asked


def test_a_held_watch_wakes_on_the_committed_change_not_on_the_recheck(paid_lease, enrol, settings):
    settings.NODE_WATCH_RECHECK_SECONDS = 60      # only the bell can answer it in time
    lease = paid_lease()
    node = enrol(node_of(lease))
    version = version_of(node)

    def customer_restarts():
        from fleet.services import instance_restart
        from rental.agent import Instance
        from rental.services import lease_provisioned
        lease_provisioned(lease_id=lease.pk, instance=Instance(host="203.0.113.7", ssh_port=22042),
                          now=timezone.now())
        instance_restart(lease_id=lease.pk, customer=lease.customer, now=timezone.now())

    answer, took = held_watch(node, version=version, wait=50, while_waiting=customer_restarts)
    assert answer["changed"] is True and answer["version"] != version and version_of(node) != version
    assert took < 50
    assert desired_watch.bell.count() == 0          # the waiter left with its request


def test_a_change_to_another_node_does_not_wake_it_and_the_wait_ends_unchanged(paid_lease, enrol, settings):
    settings.NODE_WATCH_RECHECK_SECONDS = 0.2
    lease = paid_lease()
    node = enrol(node_of(lease))
    version = version_of(node)
    answer, took = held_watch(node, version=version, wait=1.0,
                              while_waiting=lambda: desired_changed([node.node.pk + 1000]))
    assert answer == {"changed": False, "version": version}
    assert took >= 1.0



def test_the_wait_counts_from_when_the_watch_came_not_from_when_a_thread_was_free(
        paid_lease, enrol, monkeypatch, settings):
    """A watch whose trip to a thread queued behind others is still answered `wait` seconds
    after it came."""
    settings.NODE_WATCH_RECHECK_SECONDS = 60
    node = enrol(node_of(paid_lease()))
    version = version_of(node)
    queued, wait, look_up = 1.5, 2.0, views._watching_agent

    def behind_others(request, fresh_connections):
        time.sleep(queued)
        return look_up(request, fresh_connections)

    monkeypatch.setattr(views, "_watching_agent", behind_others)
    answer, took = held_watch(node, version=version, wait=wait)
    assert answer == {"changed": False, "version": version}
    # before: held `wait` seconds after the thread came back, so queued + wait in all
    assert wait <= took < wait + queued, took

def test_a_change_announced_by_another_process_rings_the_bell():
    """What the pub/sub listener hands over: a list of node ids, or every node."""
    from fleet.desired_watch import _ring_for

    async def ring() -> list:
        bell = desired_watch.bell
        with bell.waiter(7) as seven, bell.waiter(8) as eight:
            _ring_for(b"n1|3,7")
            rung = [await seven.rung(0.5), seven.news, await eight.rung(0.05)]
            _ring_for(b"e2|*")
            return [*rung, await eight.rung(0.5), eight.news]

    assert in_own_thread(async_to_sync(ring)) == [True, ("node", "n1"), False, True, ("epoch", "e2")]

    async def heard_before_registering() -> list:
        bell = desired_watch.bell
        read_at = time.monotonic()          # the version read here ...
        _ring_for(b"n3|9")                  # ... a change comes before the waiter is registered
        with bell.waiter(9, read_at=read_at) as nine, bell.waiter(9, read_at=time.monotonic()) as later:
            return [await nine.rung(0.5), nine.news, await later.rung(0.05)]

    assert in_own_thread(async_to_sync(heard_before_registering)) == [True, ("node", "n3"), False]
    assert desired_watch.version_after("e0.v0", ("node", "n1")) == "e0.n1"
    assert desired_watch.version_after("e0.v0", ("epoch", "e2")) == "e2.v0"
    assert desired_watch.version_after("not-a-token", ("node", "n1")) is None


@pytest.mark.parametrize("params, status, error", [
    ({"version": "x", "wait": "soon"}, 400, "invalid_request"),
    ({"version": "x", "wait": "-1"}, 400, "invalid_request"),
    ({"version": "x", "wait": "nan"}, 400, "invalid_request"),
])
def test_bad_input_is_a_4xx(paid_lease, enrol, params, status, error):
    node = enrol(node_of(paid_lease()))
    response = watch_over_wsgi(node, **params)
    assert (response.status_code, response.json()) == (status, {"error": error})


def test_a_watch_needs_the_node_credential_and_a_get(client):
    assert in_own_thread(lambda: client.get("/agent/v1/desired/watch", {"version": "x"})).status_code == 401
    assert in_own_thread(lambda: client.get("/agent/v1/desired/watch",
                                            HTTP_AUTHORIZATION="Node nope")).status_code == 401
    assert in_own_thread(lambda: client.post("/agent/v1/desired/watch")).status_code == 405


@pytest.mark.parametrize("reports_wait", [True, False], ids=["the report that waits", "the watch"])
def test_the_real_agent_gets_a_change_long_before_its_next_poll(live_server, catalog, operator, settings, tmp_path,
                                                                reports_wait):
    """The shipped agent's loop against the storefront over HTTP: with a 60 s poll interval,
    a committed change to its node reaches it through the wait (PROTOCOL.md), not the poll:
    its held report is answered at the new version (with the document, had it changed), or
    the watch says "changed" and the agent fetches it."""
    import threading

    from django.db import transaction

    from tests.deadlines import wait_for

    settings.NODE_POLL_SECONDS = 60
    settings.NODE_WATCH_WSGI_HOLD_SECONDS = 60      # the live server is WSGI, one thread per request
    agent, node = leaseless_agent(live_server.url, operator, tmp_path, poll_seconds=60)
    agent.reports_wait = reports_wait
    waiting_on = "report/watch" if reports_wait else "desired/watch"
    calls, original, in_flight = [], agent.client.session.request, [0]

    def spy(method, url, **kwargs):
        path = url.split("/agent/v1/")[1].split("?")[0]
        calls.append(("start", path, time.monotonic()))
        in_flight[0] += 1
        try:
            response = original(method, url, **kwargs)
        finally:
            in_flight[0] -= 1
        answer = response.json() if response.status_code == 200 else {}
        # the watch says "changed"; the report's answer comes at a version past the one sent
        news = answer.get("changed") if path == "desired/watch" else \
            f"version={response.headers.get(views.VERSION_HEADER)}&" not in url + "&"
        calls.append((method, path, response.status_code, news, time.monotonic()))
        return response

    agent.client.session.request = spy
    stop = threading.Event()
    loop = threading.Thread(target=agent.run_forever, args=(stop,), daemon=True)
    loop.start()
    try:
        wait_for(lambda: ("start", waiting_on) in [c[:2] for c in calls], 30, "the agent to start waiting")
        # From before the change: without a Redis to listen to (the SQLite pass), a held wait
        # re-reads the version now and then, and may see the change's first bump (made inside
        # its transaction, fleet/desired_version.py) and answer before the commit returns.
        changed_at = time.monotonic()
        with transaction.atomic():
            desired_changed([node.pk])
        document_came = (lambda c: c[:2] == ("POST", "report/watch") and c[3]) if reports_wait else \
            (lambda c: c[0] == "GET" and c[1] == "desired")
        got = wait_for(lambda: [c for c in calls if c[0] != "start" and document_came(c) and c[-1] > changed_at],
                       30, "the agent to get its changed desired state")
        took = got[0][-1] - changed_at
        print(f"\nchange committed -> agent got its desired state ({waiting_on}): {took * 1000:.0f} ms "
              "(poll interval 60 s)")
        if not reports_wait:
            answered = [c for c in calls if c[:2] == ("GET", "desired/watch") and c[-1] > changed_at]
            assert answered and answered[0][3] is True and answered[0][-1] <= got[0][-1]
        assert took < 30                     # the wait, not the 60 s poll
        # a steady node waited on one kind of call only (an answer that came early with the
        # document it holds leaves the rest of the interval to the watch)
        other = "desired/watch" if reports_wait else "report/watch"
        assert not [c for c in calls if c[1] == other and c[-1] < changed_at]
    finally:
        stop.set()
        loop.join(timeout=90)
        # the wait the stopped agent left held on the live server ends too (its thread
        # would otherwise keep the test process from exiting for the whole hold), and is
        # answered before the test's database goes (a held report's answer reads it)
        with transaction.atomic():
            desired_changed([node.pk])
        wait_for(lambda: in_flight[0] == 0, 30, "the call the stopped agent left to be answered")
