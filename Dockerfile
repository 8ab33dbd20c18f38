# The storefront image: web, the two workers (worker, outbound), beat and the migrate step (docker-compose.yml).
# Static files and translation catalogs are built here, at build time, by the same script
# the CI smoke test runs (scripts/build-assets.sh). At run time the image is read-only
# and runs as `app`; the only place it writes is its data volume, /data (VAR_DIR).
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PYTHONPATH=/app \
    VAR_DIR=/data STATIC_ROOT=/app/staticfiles DJANGO_SETTINGS_MODULE=storefront.settings
WORKDIR /app
RUN apt-get update && apt-get install -y --no-install-recommends gettext \
    && rm -rf /var/lib/apt/lists/*
# ADR 0024: the dependencies from the runtime lock (exact versions, hashes checked), in a
# layer of their own; then the project itself without resolving anything.
COPY requirements/run.lock requirements/run.lock
RUN pip install --no-cache-dir --require-hashes -r requirements/run.lock
COPY . .
RUN pip install --no-cache-dir --no-deps . \
    && VAR_DIR=/tmp/build-var scripts/build-assets.sh && rm -rf /tmp/build-var \
    && useradd --uid 10001 --home-dir /data --no-create-home --shell /usr/sbin/nologin app \
    && mkdir -p /data && chown app:app /data
USER app
VOLUME ["/data"]
EXPOSE 8000
CMD ["scripts/start.sh", "web"]
