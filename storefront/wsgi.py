import gc
import os

from django.core.wsgi import get_wsgi_application
from django.urls import get_resolver

from storefront.accesslog import AccessLog

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "storefront.settings")
application = get_wsgi_application()
#: What production serves (scripts/start.sh web): the application with its access log.
served = AccessLog(application)

# The URLconf and every view module, imported now rather than on the first request, so that
# they are among the objects frozen next.
get_resolver().url_patterns  # noqa: B018 - read for its import
# Everything loaded so far lives as long as the worker. Out of the cyclic collector's way, a
# full collection walks only what requests and the caches made since, not the start-up's
# ~150,000 objects: a pause of ~100 ms on a slow host, for every request of the worker, at
# each full collection (docs/adr/0035-web-workers-freeze-their-start-up-objects.md).
gc.freeze()
