"""The load baseline: the cheapest response the same web server + Django stack can give
(no database, no template, no session). Mounted at /bench/bare only when
settings.BENCH_BASELINE_VIEW is true (bench/load.py sets BENCH_BASELINE_VIEW=1)."""
from django.http import HttpResponse
from django.views.decorators.http import require_GET


@require_GET
def bare(request):
    return HttpResponse("ok", content_type="text/plain")
