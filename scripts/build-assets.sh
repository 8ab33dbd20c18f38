#!/usr/bin/env bash
# Build-time assets, shared by the Dockerfile and the CI smoke test (tests/deploy/):
# compiled translation catalogs and the hashed, compressed static files in STATIC_ROOT
# (whitenoise's manifest). Needs no database and no secret: placeholders (a throw-away
# random key) satisfy the production settings check (DEBUG=0); nothing here connects to
# a database or signs anything.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python}"
export DEBUG=0 DJANGO_SETTINGS_MODULE=storefront.settings
throwaway_key="$(head -c 48 /dev/urandom | base64 | tr -d '/+=\n')"
export SECRET_KEY=${SECRET_KEY:-$throwaway_key}
export ALLOWED_HOSTS="${ALLOWED_HOSTS:-build.invalid}"
export DATABASE_URL="${DATABASE_URL:-postgres://build@build.invalid:5432/build}"

"$PYTHON" manage.py compilemessages --ignore=.venv --ignore=.chain-tools -v 0
"$PYTHON" manage.py collectstatic --noinput --clear -v 0
echo "static files in $("$PYTHON" -c 'import django; django.setup(); from django.conf import settings; print(settings.STATIC_ROOT)'), catalogs compiled"
