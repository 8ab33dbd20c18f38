#!/usr/bin/env bash
# Everything outside Python that the test suite drives for real: Debian's chromium (browser
# tests), gettext (catalog tests), the local chains (litecoind, monero, anvil), the node
# agent's tools (docker, debootstrap, sshd, gcc, iproute2), the disk tools (cryptsetup,
# nvme-cli, lvm2, qemu), the deploy tools (caddy, pg_dump) and Ceph (install-ceph.sh: the
# test cluster of tests/storage). Idempotent; root.
# Exits non-zero when any install fails, so CI never passes by skipping what is missing.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/apt-lib.sh

status=0
apt_install_all chromium gettext postgresql-client || status=1
# tests/bench runs bench/load.py at its smallest size (wrk drives the web server).
apt_install_all wrk || status=1
# bench/faults.py's smoke run initdb-s its own cluster and starts its own redis-server.
apt_install_all postgresql redis-server || status=1
# tests/ha: point-in-time recovery (pgBackRest) and a Patroni cluster on etcd, each its own throwaway copy.
apt_install_all pgbackrest patroni etcd-server etcd-client || status=1
for part in install-chain-tools install-node-tools install-disk-tools install-deploy-tools install-ceph install-measure-tools; do
  if [ -f "scripts/$part.sh" ]; then
    echo "== scripts/$part.sh"
    bash "scripts/$part.sh" || { echo "!! scripts/$part.sh failed" >&2; status=1; }
  fi
done
exit $status
