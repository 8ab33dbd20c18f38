"""POST /agent/v1/report/watch (fleet/views.py `report_watch`): the report is taken at once,
as POST /agent/v1/report takes it; when its answer says the node holds its current desired
state at the version it names, the answer is held until that state moves (then it carries
the new document and version) or for `wait` seconds. Anything else, and any call under WSGI,
is answered at once."""
import json
import time

import pytest
from django.test import AsyncRequestFactory, Client
from django.utils import timezone

from fleet import desired_watch, views

from .conftest import node_of
from .waits import held, in_own_thread

pytestmark = pytest.mark.django_db(transaction=True)   # changes announce on commit


def held_state(node) -> tuple[str, str]:
    """The ETag and version of the node's current desired state, as its agent holds them."""
    response = node.desired()
    assert response.status_code == 200
    return response["ETag"], response[views.VERSION_HEADER]


def report_request(node, body: bytes, **query):
    return AsyncRequestFactory().post(
        "/agent/v1/report/watch", body, content_type="application/json", QUERY_STRING="&".join(
            f"{k}={v}" for k, v in query.items()),
        headers={"Authorization": f"Node {node.credential}", "X-Node-Signature": node.sign(body)})


def held_report(node, body: bytes, *, while_waiting=None, **query):
    response, took = held(views.report_watch, report_request(node, body, **query), while_waiting=while_waiting)
    return response, json.loads(response.content), took


def replayed(node, body: bytes) -> bool:
    """Whether the storefront already took this report (its seq is spent)."""
    response = in_own_thread(lambda: node.post(body))
    return (response.status_code, response.json().get("error")) == (409, "replayed")


def provisioned(lease):
    from rental.agent import Instance
    from rental.services import lease_provisioned
    lease_provisioned(lease_id=lease.pk, instance=Instance(host="203.0.113.7", ssh_port=22042), now=timezone.now())


def restart(lease):
    """One committed change to the node's desired state (the held answer is built while the
    test's thread could still be writing: on SQLite that is a locked table)."""
    from fleet.services import instance_restart
    instance_restart(lease_id=lease.pk, customer=lease.customer, now=timezone.now())


def test_a_steady_report_is_taken_at_once_and_answered_with_the_new_document_when_it_moves(
        paid_lease, enrol, settings):
    settings.NODE_WATCH_RECHECK_SECONDS = 60      # only the bell can answer it in time
    lease = paid_lease()
    node = enrol(node_of(lease))
    provisioned(lease)
    etag, version = held_state(node)
    body = node.body(desired_etag=etag)
    taken_while_held = []

    def meanwhile():
        taken_while_held.append(replayed(node, body))
        restart(lease)

    response, answer, took = held_report(node, body, version=version, wait=50, while_waiting=meanwhile)
    assert response.status_code == 200 and taken_while_held == [True]
    assert answer["desired"] is not None and answer["desired_etag"] not in ("", etag)
    assert response[views.VERSION_HEADER] not in ("", version)
    assert took < 50
    assert desired_watch.bell.count() == 0          # the waiter left with its request


def test_nothing_new_is_the_reports_own_answer_after_the_wait(paid_lease, enrol, settings):
    settings.NODE_WATCH_RECHECK_SECONDS = 0.2
    lease = paid_lease()
    node = enrol(node_of(lease))
    etag, version = held_state(node)
    response, answer, took = held_report(node, node.body(desired_etag=etag), version=version, wait=1.0,
                                         while_waiting=lambda: None)
    assert (answer["desired"], answer["desired_etag"], response[views.VERSION_HEADER]) == (None, etag, version)
    assert answer["accepted"] == [] and answer["refused"] == []
    assert took >= 1.0


@pytest.mark.parametrize("behind", ["document", "version"])
def test_a_node_behind_is_answered_at_once(paid_lease, enrol, behind):
    lease = paid_lease()
    node = enrol(node_of(lease))
    etag, version = held_state(node)
    held_etag, held_version = ("", version) if behind == "document" else (etag, "0.0")
    response, answer, took = held_report(node, node.body(desired_etag=held_etag), version=held_version, wait=50)
    assert response.status_code == 200 and took < 25
    assert (answer["desired"] is not None) == (behind == "document")
    assert response[views.VERSION_HEADER] == version


def test_under_wsgi_the_report_is_taken_and_answered_at_once(paid_lease, enrol, settings):
    settings.NODE_WATCH_WSGI_HOLD_SECONDS = 0
    lease = paid_lease()
    node = enrol(node_of(lease))
    etag, version = held_state(node)
    body = node.body(desired_etag=etag)
    agent = Client(enforce_csrf_checks=True)      # an agent sends no CSRF token: the view is exempt
    response = in_own_thread(lambda: agent.post(
        f"/agent/v1/report/watch?version={version}&wait=50", body, content_type="application/json",
        HTTP_X_NODE_SIGNATURE=node.sign(body), **node.auth))
    assert response.status_code == 200 and response.json()["desired"] is None
    assert replayed(node, body)


@pytest.mark.parametrize("query, signed, credential, status, error", [
    ("version=x&wait=soon", True, True, 400, "invalid_request"),
    ("version=x&wait=-1", True, True, 400, "invalid_request"),
    ("version=x&wait=5", False, True, 401, "bad_signature"),
    ("version=x&wait=5", True, False, 401, "unauthorized"),
])
def test_bad_input_is_a_4xx_and_nothing_is_taken(paid_lease, enrol, query, signed, credential, status, error):
    node = enrol(node_of(paid_lease()))
    etag, _ = held_state(node)
    body = node.body(desired_etag=etag)
    headers = {"HTTP_X_NODE_SIGNATURE": node.sign(body) if signed else node.sign(b"other")}
    if credential:
        headers.update(node.auth)
    response = in_own_thread(lambda: node.client.post(f"/agent/v1/report/watch?{query}", body,
                                                      content_type="application/json", **headers))
    assert (response.status_code, response.json()) == (status, {"error": error})
    assert not replayed(node, body)


def test_it_takes_a_post_only(paid_lease, enrol):
    node = enrol(node_of(paid_lease()))
    response = in_own_thread(lambda: node.client.get("/agent/v1/report/watch", {"version": "x"}, **node.auth))
    assert (response.status_code, response.json()) == (405, {"error": "method_not_allowed"})


def test_under_asgi_the_report_is_taken_on_the_reports_own_thread(paid_lease, enrol, monkeypatch):
    """NODE_WATCH_REPORT_THREADS: not the loop's default pool, whose threads would hand the
    GIL to each other at every Redis round trip of a fleet's reports."""
    import threading

    lease = paid_lease()
    node = enrol(node_of(lease))
    etag, version = held_state(node)
    taken_on, take = [], views._report_in_thread

    def recorded(request, fresh_connections):
        taken_on.append(threading.current_thread().name)
        return take(request, fresh_connections)

    monkeypatch.setattr(views, "_report_in_thread", recorded)
    response, _answer, _took = held_report(node, node.body(desired_etag=etag), version=version, wait=0)
    assert response.status_code == 200
    assert len(taken_on) == 1 and taken_on[0].startswith("node-report")


def test_the_wait_counts_from_when_the_report_came_not_from_when_its_thread_was_free(
        paid_lease, enrol, monkeypatch, settings):
    """A report queued on the reports' thread (behind a burst of others) is still answered
    `wait` seconds after it came: the node asked for its answer then, not that much later."""
    settings.NODE_WATCH_RECHECK_SECONDS = 60        # subscribed or not, nothing rechecks meanwhile
    lease = paid_lease()
    node = enrol(node_of(lease))
    etag, version = held_state(node)
    queued, wait, take = 1.5, 2.0, views._report_in_thread

    def behind_others(request, fresh_connections):
        time.sleep(queued)
        return take(request, fresh_connections)

    monkeypatch.setattr(views, "_report_in_thread", behind_others)
    response, answer, took = held_report(node, node.body(desired_etag=etag), version=version, wait=wait)
    assert response.status_code == 200 and answer["desired"] is None
    # before: held `wait` seconds after the thread came back, so queued + wait in all
    assert wait <= took < wait + queued, took
