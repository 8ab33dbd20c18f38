"""Schemathesis against /api/v1/schema, in process through Django's WSGI app: for every
operation the schema describes, generated requests — valid and invalid, with a real
customer's bearer token so the authenticated paths run too — never get a 5xx. Bounded:
MAX_EXAMPLES per operation (override with API_FUZZ_EXAMPLES)."""
import os

import pytest
import schemathesis
from django.core import signals
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from rental.accounts.services import api_token_create

MAX_EXAMPLES = int(os.environ.get("API_FUZZ_EXAMPLES", "30"))
schema = schemathesis.openapi.from_wsgi("/api/v1/schema", get_wsgi_application())


@pytest.fixture
def bearer(catalog, customer):
    """A real token; and, as Django's test client does, the WSGI handler must not close the
    connection at the end of each request (that would end the test's transaction)."""
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    yield {"Authorization": "Bearer " + api_token_create(customer=customer, name="fuzz")[1]}
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)


@pytest.mark.django_db
@schema.parametrize()
@settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
def test_no_generated_request_gets_a_server_error(case, bearer):
    case.call_and_validate(headers=bearer, checks=[not_a_server_error])


def test_the_schema_covers_the_endpoints():
    paths = {op.ok().path for op in schema.get_all_operations()}
    assert {"/offers", "/orders", "/leases", "/leases/{id}", "/invoices/{id}", "/estimate"} <= \
        {p.removeprefix("/api/v1") for p in paths}, paths
