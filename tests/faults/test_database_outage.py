"""A database outage is a clean 503 with Retry-After, never a 500: in a view (pages and
the JSON API), and in middleware after the view (the session save). Simulated by making
every new cursor raise the OperationalError a dead PostgreSQL gives; bench/faults.py does
it for real with `pg_ctlcluster restart` under load."""
import pytest
from django.db import InterfaceError, OperationalError, connections
from django.test import Client
from django.urls import reverse

pytestmark = pytest.mark.django_db


@pytest.fixture
def database_down(monkeypatch):
    def refuse(*args, **kwargs):
        raise OperationalError('connection to server at "127.0.0.1", port 5432 failed: Connection refused')

    def down():
        monkeypatch.setattr(connections["default"], "create_cursor", refuse)
    return down


@pytest.mark.parametrize("path", ["/", "/gpus/?vendor=nvidia&min_vram=40", "/faq/", "/storage/", "/links/",
                                  "/gpus/rtx-3090/"])
def test_pages_answer_503_with_retry_after(catalog, database_down, path):
    database_down()
    response = Client(raise_request_exception=False).get(path)
    assert response.status_code == 503, (path, response.status_code)
    assert response["Retry-After"].isdigit() and response["Cache-Control"] == "no-store"
    assert "Back in a moment" in response.content.decode()


def test_logging_in_during_an_outage_is_a_503(catalog, customer, database_down):
    database_down()
    response = Client(raise_request_exception=False).post(
        reverse("login"), {"username": "alice", "password": "correct horse battery 9"})
    assert response.status_code == 503 and response["Retry-After"]


def test_signed_in_pages_answer_503(catalog, customer, database_down):
    client = Client(raise_request_exception=False)
    client.force_login(customer)
    database_down()
    for path in (reverse("lease_list"), reverse("billing:invoices"), reverse("account_settings")):
        response = client.get(path)
        assert response.status_code == 503 and response["Retry-After"], path


@pytest.mark.parametrize("path", ["/api/v1/offers", "/api/v1/leases", "/api/v1/estimate?model=llama-2-13b"])
def test_api_answers_json_503(catalog, database_down, path):
    database_down()
    response = Client(raise_request_exception=False).get(path, HTTP_AUTHORIZATION="Bearer gpr_" + "x" * 43)
    assert response.status_code == 503 and response["Retry-After"]
    assert response.json()["error"] == "unavailable"


def test_interface_error_too(catalog, monkeypatch):
    def closed(*args, **kwargs):
        raise InterfaceError("connection already closed")

    monkeypatch.setattr(connections["default"], "create_cursor", closed)
    assert Client(raise_request_exception=False).get("/gpus/").status_code == 503


def test_an_outage_in_middleware_after_the_view_is_a_503_too(catalog, monkeypatch):
    """The session save runs in SessionMiddleware after the view: handler500 turns it into a 503."""
    from django.contrib.sessions.backends.db import SessionStore

    def refuse(self, *args, **kwargs):
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(SessionStore, "save", refuse)
    client = Client(raise_request_exception=False)
    response = client.post(reverse("signup"), {"username": "newbie", "password1": "correct horse battery 9",
                                              "password2": "correct horse battery 9", "email": ""})
    # signup logs the user in (session save) → the save fails → 503 from handler500
    assert response.status_code == 503 and response["Retry-After"]


def test_other_errors_are_still_500(catalog, monkeypatch):
    from inventory import views

    def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(views, "catalog_rows", broken)
    assert Client(raise_request_exception=False).get("/").status_code == 500


def test_service_recovers_when_the_database_is_back(catalog, database_down, monkeypatch):
    database_down()
    assert Client(raise_request_exception=False).get("/gpus/").status_code == 503
    monkeypatch.undo()
    assert Client().get("/gpus/").status_code == 200
