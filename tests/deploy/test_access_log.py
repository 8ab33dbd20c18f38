"""The production access log's rules (storefront/accesslog.py, the WSGI middleware production
serves): the stack test (test_production.py) reads real lines through Caddy; these check
what is left out and what a line holds."""
import io

import pytest

from storefront.accesslog import AccessLog


@pytest.fixture
def logged():
    stream = io.StringIO()

    def log(path: str, status: int, method="POST", **environ) -> list[str]:
        def app(environ, start_response):
            start_response(f"{status} X", [("Content-Type", "text/plain"), ("Content-Length", "2")])
            return [b"ok"]
        environ = {"PATH_INFO": path, "REQUEST_METHOD": method, "SERVER_PROTOCOL": "HTTP/1.1",
                   "REMOTE_ADDR": "127.0.0.1", "QUERY_STRING": "", **environ}
        assert AccessLog(app, stream)(environ, lambda status, headers, exc_info=None: None) == [b"ok"]
        return stream.getvalue().splitlines()
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


def test_a_line_names_the_client_the_proxy_the_request_and_the_answer(logged):
    [line] = logged("/gpus/", 200, method="GET", QUERY_STRING="vendor=nvidia", HTTP_X_FORWARDED_FOR="203.0.113.9",
                    HTTP_USER_AGENT="curl/8.1")
    assert line.startswith("203.0.113.9 via 127.0.0.1 - - [")
    assert line.endswith('] "GET /gpus/?vendor=nvidia HTTP/1.1" 200 2 "-" "curl/8.1"'), line


def test_a_reset_token_is_redacted_in_the_request_and_the_referrer(logged):
    token_path = "/accounts/password/reset/MQ/cz6f-0123456789abcdef/"
    [line] = logged(token_path, 302, method="GET", HTTP_REFERER=f"https://shop.example{token_path}")
    assert "cz6f-0123456789abcdef" not in line
    assert line.count("/accounts/password/reset/MQ/[redacted]/") == 2, line


@pytest.mark.parametrize("status, lines", [(200, 0), (401, 1), (503, 1)])
def test_the_nodes_waits_on_the_asgi_process_are_logged_by_the_same_rules(monkeypatch, capsys, status, lines):
    """The watch process serves the watch and the report that waits outside the WSGI
    middleware: a refusal or failure still gets its line, with the client's address."""
    from asgiref.sync import async_to_sync

    import storefront.asgi

    async def answered(scope, receive, send):
        await send({"type": "http.response.start", "status": status, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"{}"})

    monkeypatch.setattr(storefront.asgi, "watch_app", answered)
    monkeypatch.setenv("PROXIES_AFTER_CLIENT", "0")
    scope = {"type": "http", "method": "POST", "path": "/agent/v1/report/watch", "query_string": b"version=e.v&wait=15",
             "http_version": "1.1", "client": ("10.0.0.2", 5000),
             "headers": [(b"x-forwarded-for", b"203.0.113.9"), (b"user-agent", b"gpu-node-agent/0.1.0")]}

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        pass

    async_to_sync(storefront.asgi.application)(scope, receive, send)
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == lines
    if lines:
        assert printed[0].startswith("203.0.113.9 via 10.0.0.2 - - [")
        assert printed[0].endswith(f'"POST /agent/v1/report/watch?version=e.v&wait=15 HTTP/1.1" {status} 2 "-" '
                                   '"gpu-node-agent/0.1.0"'), printed[0]
