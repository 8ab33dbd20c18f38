"""The ASGI application: what `scripts/start.sh watch` serves, for the nodes' long waits on
GET /agent/v1/desired/watch and POST /agent/v1/report/watch (fleet/desired_watch.py) — a
waiting node costs this process memory, not a thread (fleet/asgi.py). Any other path goes to Django's ASGI handler, so the
process can stand in for the web one, but production routes only those two here (Caddyfile)."""
import os
import sys
import time

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "storefront.settings")
django_app = get_asgi_application()

from fleet import collector  # noqa: E402  (after Django is set up)
from fleet.asgi import REPORT_WATCH_PATH, WATCH_PATH, watch_app  # noqa: E402
from storefront.accesslog import access_line  # noqa: E402


def _environ(scope) -> dict:
    """What the access log reads of a request, from its ASGI scope."""
    headers = {name.decode("latin-1").upper().replace("-", "_"): value.decode("latin-1")
               for name, value in scope.get("headers", ())}
    client = scope.get("client") or ("-", 0)
    return {"REQUEST_METHOD": scope["method"], "PATH_INFO": scope["path"],
            "QUERY_STRING": scope.get("query_string", b"").decode("latin-1"),
            "SERVER_PROTOCOL": f"HTTP/{scope.get('http_version', '1.1')}", "REMOTE_ADDR": client[0],
            **{f"HTTP_{name}": value for name, value in headers.items()
               if name in ("X_FORWARDED_FOR", "REFERER", "USER_AGENT")}}


async def _node_wait(scope, receive, send) -> None:
    """The nodes' waits, logged as the web's access log logs the agents' calls: a refusal or a
    failure (4xx, 5xx) gets its line, an answered wait none (storefront/accesslog.py)."""
    async def logged_send(message):
        if message["type"] == "http.response.start" and message["status"] >= 400:
            line = access_line(_environ(scope), str(message["status"]), [
                (name.decode("latin-1"), value.decode("latin-1")) for name, value in message["headers"]], time.time())
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
        await send(message)

    await watch_app(scope, receive, logged_send)


async def application(scope, receive, send):
    if scope["type"] == "lifespan":      # Django's handler refuses it
        while (await receive())["type"] != "lifespan.shutdown":
            collector.start()            # the oldest generation on a timer (fleet/collector.py)
            await send({"type": "lifespan.startup.complete"})
        collector.stop()
        await send({"type": "lifespan.shutdown.complete"})
    elif scope["type"] == "http" and scope["path"] in (WATCH_PATH, REPORT_WATCH_PATH):
        await _node_wait(scope, receive, send)
    else:
        await django_app(scope, receive, send)
