#!/usr/bin/env bash
# Back up the storefront database: pg_dump of DATABASE_URL in PostgreSQL's custom format
# (compressed, restorable table by table) to BACKUP_DIR/storefront-<UTC time>.dump.
# Prints the file's path. Restore with scripts/restore.sh into a fresh database.
# With docker compose:  docker compose run --rm backup /scripts/backup.sh
set -euo pipefail
url="${DATABASE_URL:?DATABASE_URL is not set (postgres://user:password@host:5432/name)}"
dir="${BACKUP_DIR:-backups}"
mkdir -p "$dir"
file="$dir/storefront-$(date -u +%Y%m%dT%H%M%SZ).dump"
pg_dump --format=custom --no-owner --no-privileges --dbname="$url" --file="$file.partial"
mv "$file.partial" "$file"  # a dump cut short never looks complete
echo "$file"
