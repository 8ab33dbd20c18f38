#!/usr/bin/env bash
# `make test-stress`: the suite as CI's PostgreSQL phases run it (every test: the xdist pass with
# the infrastructure tests, then the node in a box), RUNS times in a row (default 3), with HOGS
# busy loops (default 1: one of CI's two cores) running beside it the whole time. A test that
# passes only on a quiet machine fails here. Stops at the first failing run; prints each run's
# time and a closing line. Needs PostgreSQL and Redis (as .ci/run starts them) and the tools of
# scripts/install-test-tools.sh.
#   RUNS=3 HOGS=1 PG_SERVER=postgres://postgres@127.0.0.1:5432 REDIS_URL=redis://127.0.0.1:6379/13
#   NODE_BOX=0 leaves the node in a box out (it alone takes 3-11 minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
export CI="${CI:-true}"
RUNS="${RUNS:-3}"
HOGS="${HOGS:-1}"
NODE_BOX="${NODE_BOX:-1}"
SERVER="${PG_SERVER:-postgres://postgres@127.0.0.1:5432}"  # a database of its own is made there
export REDIS_URL="${REDIS_URL:-redis://127.0.0.1:6379/13}"
DB="storefront_stress_$$"
export DATABASE_URL="$SERVER/$DB"

hogs=()
cleanup() {
  for pid in "${hogs[@]}"; do kill "$pid" 2>/dev/null || true; done
  psql "$SERVER/postgres" -qc "DROP DATABASE IF EXISTS $DB" >/dev/null 2>&1 || true
  for suffix in "" _gw0 _gw1 _gw2 _gw3; do
    psql "$SERVER/postgres" -qc "DROP DATABASE IF EXISTS test_$DB$suffix" >/dev/null 2>&1 || true
  done
}
trap cleanup EXIT
psql "$SERVER/postgres" -qc "CREATE DATABASE $DB"

for _ in $(seq "$HOGS"); do
  bash -c 'while :; do :; done' &
  hogs+=($!)
done
echo "== test-stress: $RUNS run(s) on $SERVER/$DB with Redis $REDIS_URL, $HOGS CPU hog(s) beside (pids ${hogs[*]:-none})"

START=$SECONDS
for run in $(seq "$RUNS"); do
  run_start=$SECONDS
  echo "== run $run of $RUNS: the xdist pass (all but the node in a box), load $(cut -d' ' -f1-3 /proc/loadavg)"
  if ! PYTEST_ADDOPTS="-m 'not node_box' -p no:cacheprovider --durations=25" scripts/test.sh; then
    echo "test-stress: run $run failed after $((SECONDS - run_start)) s" >&2
    exit 1
  fi
  if [ "$NODE_BOX" = "1" ]; then
    echo "== run $run of $RUNS: the node in a box, load $(cut -d' ' -f1-3 /proc/loadavg)"
    scripts/build-node-guest-image.sh
    if ! .venv/bin/python -m pytest tests/nodeagent/test_node_in_a_box.py -m node_box -p no:xdist \
        -p no:cacheprovider -s -q; then
      echo "test-stress: run $run failed (node in a box) after $((SECONDS - run_start)) s" >&2
      exit 1
    fi
  fi
  echo "== run $run of $RUNS passed in $((SECONDS - run_start)) s"
done
echo "test-stress: $RUNS of $RUNS runs passed with $HOGS CPU hog(s) beside, in $((SECONDS - START)) s"
