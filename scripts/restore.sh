#!/usr/bin/env bash
# Restore a backup made by scripts/backup.sh into a FRESH, empty database:
#   scripts/restore.sh BACKUP.dump [TARGET_DATABASE_URL]   (default: DATABASE_URL)
# Refuses a database that already has tables; restores in one transaction, so a failure
# leaves the target empty. Then point DATABASE_URL at it and start the stack
# (the migrate step finds nothing to do for a backup of the same version).
set -euo pipefail
file="${1:?usage: restore.sh BACKUP.dump [TARGET_DATABASE_URL]}"
target="${2:-${DATABASE_URL:?give TARGET_DATABASE_URL or set DATABASE_URL}}"
[ -r "$file" ] || { echo "restore: cannot read $file" >&2; exit 1; }
tables="$(psql "$target" -tAc "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'")"
if [ "$tables" != "0" ]; then
  echo "restore: the target database already has $tables tables; restore into a fresh one (createdb)" >&2
  exit 1
fi
pg_restore --no-owner --no-privileges --exit-on-error --single-transaction --dbname="$target" "$file"
echo "restored $file"
