import os

from django.core.wsgi import get_wsgi_application

from storefront.accesslog import AccessLog

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "storefront.settings")
application = get_wsgi_application()
#: What production serves (scripts/start.sh web): the application with its access log.
served = AccessLog(application)
