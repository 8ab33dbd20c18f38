"""The agent API never answers 500: Hypothesis throws random JSON, headers and bodies at
enrol, desired and report (signed correctly, so the body parser and every item check run
too, and with a bad signature, so the envelope checks run)."""
import json
import os

import pytest
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet.jsonbody import MAX_DEPTH, parse_json

from .conftest import node_of

pytestmark = pytest.mark.django_db
EXAMPLES = int(os.environ.get("FORM_FUZZ_EXAMPLES", "40"))
fuzz = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))

scalar = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
                   st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=40),
                   st.sampled_from(["2026-12-01T02:40:05Z", "running", "instance_ready", "key_destroyed",
                                    "disk_wiped", "nvml", "none", "ok", "failed", "\x00", "a" * 3000]))
json_value = st.recursive(scalar, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                          st.dictionaries(st.text(max_size=12), inner, max_size=4)),
                          max_leaves=12)
REPORT_KEYS = ("seq", "sent_at", "agent_version", "public_host", "gpus", "gpu_library", "instances", "evidence")
ITEM_KEYS = ("lease_id", "op_id", "state", "ssh_port", "egress_bytes", "error", "kind", "node", "at", "signature",
             "index", "healthy", "uuid", "commands", "result", "verification", "keyslots_after", "host")
# Small ids and indexes hit the node's real lease and slots, so the item checks run deep.
item = st.fixed_dictionaries({}, optional={**{k: json_value for k in ITEM_KEYS},
                                           "lease_id": st.one_of(json_value, st.integers(1, 5)),
                                           "index": st.one_of(json_value, st.integers(0, 8)),
                                           "healthy": st.booleans()})
report = st.fixed_dictionaries({}, optional={
    **{k: json_value for k in REPORT_KEYS},
    "gpus": st.lists(item, max_size=3), "instances": st.lists(item, max_size=3),
    "evidence": st.lists(item, max_size=3)})


@pytest.fixture(autouse=True)
def _no_rate_limit(settings):
    """The fuzzing sends hundreds of calls a minute from one address: past the agents' rate
    limit every one would stop at the 429 (tested in test_report_bounds.py)."""
    settings.NODE_ENROLMENTS_PER_IP_PER_MINUTE = settings.NODE_REQUESTS_PER_CREDENTIAL_PER_MINUTE = 10**9


def never_500(response, what):
    assert response.status_code < 500, (what, response.status_code, response.content[:300])


@pytest.fixture
def agent(paid_lease, enrol):
    return enrol(node_of(paid_lease()))


@fuzz
@given(data=st.one_of(json_value, st.fixed_dictionaries({}, optional={
    "code": json_value, "public_key": json_value, "agent_version": json_value, "hostname": json_value})))
def test_enrol(db, data):
    never_500(Client().post("/agent/v1/enrol", json.dumps(data), content_type="application/json"), data)


@fuzz
@given(raw=st.binary(max_size=300), auth=st.text(max_size=80))
def test_raw_bodies_and_headers(db, raw, auth):
    client = Client()
    never_500(client.post("/agent/v1/enrol", raw, content_type="application/json"), raw)
    never_500(client.get("/agent/v1/desired", HTTP_AUTHORIZATION=auth), auth)
    never_500(client.post("/agent/v1/report", raw, content_type="application/json", HTTP_AUTHORIZATION=auth), raw)


@fuzz
@given(data=report)
def test_signed_reports(agent, data):
    """Signed right and with a fresh seq, so every item check runs."""
    from django.utils import timezone

    from .conftest import rfc3339

    body = {**data, "seq": next(agent.seq), "sent_at": rfc3339(timezone.now())}
    raw = json.dumps(body).encode()
    never_500(agent.post(raw), body)
    never_500(agent.post(raw, signature="%%%"), body)


def test_deep_nesting_and_huge_bodies(agent):
    """A body of brackets would overflow the C JSON scanner (a segfault): refused first."""
    deep = b"[" * 100_000 + b"]" * 100_000
    assert agent.post(deep).json() == {"error": "invalid_json"}
    # Brackets inside strings (escaped quotes too) are text, not nesting.
    assert parse_json(b'{"a": "\\"' + b"[" * 1000 + b'", "b": [[1]]}') == {"a": '"' + "[" * 1000, "b": [[1]]}
    with pytest.raises(ValueError):
        parse_json(b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1))
    assert agent.post(b"x" * (300 * 1024)).status_code == 413
    never_500(Client().post("/agent/v1/enrol", deep, content_type="application/json"), "deep enrol")
