"""The ASGI application: what `scripts/start.sh watch` serves, for the nodes' long waits on
GET /agent/v1/desired/watch and POST /agent/v1/report/watch (fleet/desired_watch.py) — a
waiting node costs this process memory, not a thread (fleet/asgi.py). Any other path goes to Django's ASGI handler, so the
process can stand in for the web one, but production routes only those two here (Caddyfile)."""
import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "storefront.settings")
django_app = get_asgi_application()

from fleet.asgi import REPORT_WATCH_PATH, WATCH_PATH, watch_app  # noqa: E402  (after Django is set up)


async def application(scope, receive, send):
    if scope["type"] == "lifespan":      # nothing to start or stop; Django's handler refuses it
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
    elif scope["type"] == "http" and scope["path"] in (WATCH_PATH, REPORT_WATCH_PATH):
        await watch_app(scope, receive, send)
    else:
        await django_app(scope, receive, send)
