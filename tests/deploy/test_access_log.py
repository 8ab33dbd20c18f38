"""The production access log's rules (rental/accesslog.py), on gunicorn's own logger: the
stack test (test_production.py) reads real lines; these check what is left out."""
from datetime import timedelta
from types import SimpleNamespace

import pytest
from gunicorn.config import Config

from rental.accesslog import AccessLogger


@pytest.fixture
def logged(monkeypatch):
    config = Config()
    config.set("accesslog", "-")
    logger, lines = AccessLogger(config), []
    monkeypatch.setattr(logger.access_log, "info", lambda fmt, atoms: lines.append(fmt % atoms))

    def log(path: str, status: int, method="POST") -> list[str]:
        environ = {"PATH_INFO": path, "REQUEST_METHOD": method, "RAW_URI": path, "SERVER_PROTOCOL": "HTTP/1.1",
                   "REMOTE_ADDR": "127.0.0.1", "QUERY_STRING": ""}
        request = SimpleNamespace(headers=[], method=method, uri=path, path=path, query="", version=(1, 1))
        response = SimpleNamespace(status=f"{status} X", status_code=status, sent=2, headers=[], response_length=2)
        logger.access(response, request, environ, timedelta(milliseconds=3))
        return lines
    return log


def test_a_node_agents_successful_polls_are_not_logged_but_its_refusals_are(logged):
    assert logged("/agent/v1/report", 200) == []
    assert logged("/agent/v1/desired", 304, method="GET") == []
    assert [" 409 " in line for line in logged("/agent/v1/report", 409)] == [True]
    assert len(logged("/agent/v1/desired", 401, method="GET")) == 2
    assert len(logged("/agent/v1/report", 503)) == 3


def test_every_other_request_is_logged(logged):
    assert len(logged("/agent/v1/enrol", 200)) == 1            # enrolments are rare and worth a line
    assert len(logged("/gpus/", 200, method="GET")) == 2
