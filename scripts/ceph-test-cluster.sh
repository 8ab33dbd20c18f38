#!/usr/bin/env bash
# A single-host Ceph cluster for tests, from Debian's packages (scripts/install-ceph.sh),
# run like Ceph's own vstart.sh: no cephadm, no systemd, every daemon started directly
# with a generated ceph.conf, everything under DIR.
#
#   1 mon, 1 mgr (volumes module), 3 bluestore OSDs on sparse files (pool size 3,
#   min_size 2, failure domain osd), 1 MDS serving the CephFS "cephfs", 1 radosgw on a
#   free loopback port. Monitor ports are free loopback ports too.
#
# Usage:
#   ceph-test-cluster.sh start DIR     boot; prints the cluster's env (below) on stdout
#   ceph-test-cluster.sh env DIR       print the env of a running cluster
#   ceph-test-cluster.sh stop DIR      stop every daemon of DIR (DIR is kept)
#   ceph-test-cluster.sh osd-stop DIR N | osd-start DIR N
#
# The env (also written to DIR/env, shell-sourceable):
#   CEPH_CONF=DIR/ceph.conf  CEPH_KEYRING=DIR/keyring (client.admin)  CEPH_FS=cephfs
#   CEPH_MON_HOST=[v2:127.0.0.1:P,v1:127.0.0.1:Q]  CEPH_RGW_ENDPOINT=http://127.0.0.1:R
#   CEPH_RGW_ACCESS_KEY / CEPH_RGW_SECRET_KEY (an RGW user with admin caps)
#
# Cached: the first boot's freshly made cluster (mon store, OSD stores, pools, CephFS,
# RGW zone) is kept in $CEPH_TEST_CACHE (default /var/cache/gpu-storefront-tests),
# keyed by the Ceph version and this script; later boots copy it and only start the
# daemons (the monitor's map is rewritten for the new ports).
set -euo pipefail

cmd=${1:-}
dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || { sed -n '2,25p' "$0" >&2; exit 2; }
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
conf=$dir/ceph.conf
cache_root=${CEPH_TEST_CACHE:-/var/cache/gpu-storefront-tests}
NUM_OSDS=3
OSD_SIZE=${CEPH_TEST_OSD_SIZE:-4G}
TIMEOUT=${CEPH_TEST_TIMEOUT:-120}

stage() { echo "ceph-test-cluster: ${SECONDS}s $*" >&2; }

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

ceph_() { timeout 60 ceph -c "$conf" -k "$dir/keyring" "$@"; }

wait_for() {  # wait_for WHAT CMD...: retry CMD until it succeeds or TIMEOUT seconds pass
  local what=$1; shift
  local deadline=$((SECONDS + TIMEOUT))
  until "$@" >/dev/null 2>&1; do
    if [ $SECONDS -ge $deadline ]; then
      echo "ceph-test-cluster: timed out waiting for $what" >&2
      tail -n 30 "$dir"/log/*.log >&2 2>/dev/null || true
      return 1
    fi
    sleep 0.5
  done
}

write_conf() {  # write_conf MON_V2 MON_V1 RGW_PORT
  mkdir -p "$dir/run" "$dir/log"
  cat > "$conf" <<EOF
[global]
fsid = $(cat "$dir/fsid")
mon host = [v2:127.0.0.1:$1,v1:127.0.0.1:$2]
public addr = 127.0.0.1
ms bind ipv6 = false
auth cluster required = cephx
auth service required = cephx
auth client required = cephx
run dir = $dir/run
admin socket = $dir/run/\$name.asok
pid file = $dir/run/\$name.pid
log file = $dir/log/\$name.log
keyring = $dir/keyring
osd pool default size = 3
osd pool default min size = 2
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon allow pool delete = true
mon allow pool size one = false
mon warn on pool no redundancy = true
mon max pg per osd = 500
auth allow insecure global id reclaim = false
mon warn on insecure global id reclaim allowed = false
rgw_rados_pool_pg_num_min = 8
debug ms = 0
[mon]
mon data = $dir/mon.\$id
mon cluster log file = $dir/log/cluster.log
mon data avail warn = 2
mon data avail crit = 1
mgr initial modules = iostat
[mgr]
mgr data = $dir/mgr.\$id
keyring = $dir/mgr.\$id/keyring
[osd]
osd data = $dir/osd\$id
keyring = $dir/osd\$id/keyring
osd objectstore = bluestore
bluestore block create = true
bluestore block size = $OSD_SIZE
bluestore fsck on mount = false
osd memory target = 939524096
osd memory cache min = 134217728
bluestore cache autotune = true
osd op num shards = 1
osd op num threads per shard = 2
osd max backfills = 4
[mds]
mds data = $dir/mds.\$id
keyring = $dir/mds.\$id/keyring
mds cache memory limit = 134217728
# no client outlives a test cluster: do not wait 45 s for the cached sessions to reconnect
mds reconnect timeout = 2
[client.rgw.a]
keyring = $dir/rgw.a/keyring
rgw frontends = beast endpoint=127.0.0.1:$3
rgw data = $dir/rgw.a
rgw enable usage log = true
# quota threads: short periods for a test cluster, but never 0 — radosgw's bucket-stats sync
# thread then loops without waiting (about a fifth of a core for the cluster's whole life)
rgw user quota bucket sync interval = 1
rgw user quota sync interval = 5
rgw bucket quota ttl = 0
EOF
}

env_lines() {
  # shellcheck disable=SC1091
  local rgw_port mon_host
  mon_host=$(sed -n 's/^mon host = //p' "$conf")
  rgw_port=$(sed -n 's/^rgw frontends = beast endpoint=127.0.0.1://p' "$conf")
  echo "CEPH_CONF=$conf"
  echo "CEPH_KEYRING=$dir/keyring"
  echo "CEPH_FS=cephfs"
  echo "CEPH_MON_HOST=$mon_host"
  echo "CEPH_RGW_ENDPOINT=http://127.0.0.1:$rgw_port"
  cat "$dir/rgw-admin.env"
}

start_mon() { ceph-mon -c "$conf" -i a; }
start_mgr() { ceph-mgr -c "$conf" -i x; }
start_osd() { ceph-osd -c "$conf" -i "$1"; }
start_mds() { ceph-mds -c "$conf" -i a; }
start_rgw() { radosgw -c "$conf" -n client.rgw.a; }

pid_of() { cat "$dir/run/$1.pid" 2>/dev/null; }

stop_daemon() {  # stop_daemon NAME: SIGTERM, then SIGKILL after 10 s
  local pid
  pid=$(pid_of "$1") || return 0
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || { rm -f "$dir/run/$1.pid"; return 0; }
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true
  rm -f "$dir/run/$1.pid"
}

all_osds_up() { [ "$(ceph_ osd stat -f json | python3 -c 'import json,sys; print(json.load(sys.stdin)["num_up_osds"])')" = "$NUM_OSDS" ]; }
pgs_clean() {
  ceph_ pg stat -f json | python3 -c '
import json, sys
d = json.load(sys.stdin)
d = d.get("pg_summary", d)
states = {s["name"]: s["num"] for s in d.get("num_pg_by_state", [])}
total = d.get("num_pgs", 0)
want = sys.argv[1]
sys.exit(0 if total and sum(n for name, n in states.items() if want in name.split("+")) == total else 1)' "$1"
}
mds_active() { ceph_ fs dump -f json | grep -q '"state": *"up:active"'; }
mgr_active() { ceph_ mgr dump -f json | grep -q '"available": *true'; }
rgw_up() { curl -fsS -o /dev/null "$(env_lines | sed -n 's/^CEPH_RGW_ENDPOINT=//p')"; }
fs_ready() { ceph_ fs subvolumegroup ls cephfs; }

make_cluster() {  # a new cluster in $dir (the slow part, done once per cache key)
  rm -rf "${dir:?}"/*
  uuidgen > "$dir/fsid"
  write_conf "$(free_port)" "$(free_port)" "$(free_port)"
  ceph-authtool --create-keyring "$dir/mon.keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null
  ceph-authtool --create-keyring "$dir/keyring" --gen-key -n client.admin \
    --cap mon 'allow *' --cap osd 'allow *' --cap mds 'allow *' --cap mgr 'allow *' >/dev/null
  ceph-authtool "$dir/mon.keyring" --import-keyring "$dir/keyring" >/dev/null
  local mon_host
  mon_host=$(sed -n 's/^mon host = //p' "$conf")
  monmaptool --create --fsid "$(cat "$dir/fsid")" --addv a "$mon_host" "$dir/monmap" >/dev/null
  ceph-mon -c "$conf" --mkfs -i a --monmap "$dir/monmap" --keyring "$dir/mon.keyring"
  start_mon
  wait_for "the monitor" ceph_ mon stat
  mkdir -p "$dir/mgr.x"
  ceph_ auth get-or-create mgr.x mon 'allow profile mgr' mds 'allow *' osd 'allow *' -o "$dir/mgr.x/keyring"
  start_mgr
  for i in $(seq 0 $((NUM_OSDS - 1))); do
    mkdir -p "$dir/osd$i"
    local uuid secret
    uuid=$(uuidgen)
    secret=$(ceph-authtool --gen-print-key)
    echo "{\"cephx_secret\": \"$secret\"}" > "$dir/osd$i/new.json"
    ceph_ osd new "$uuid" "$i" -i "$dir/osd$i/new.json" >/dev/null
    rm "$dir/osd$i/new.json"
    ceph-osd -c "$conf" -i "$i" --mkfs --key "$secret" --osd-uuid "$uuid" 2>>"$dir/log/mkfs.log"
    printf '[osd.%s]\n\tkey = %s\n' "$i" "$secret" > "$dir/osd$i/keyring"
    start_osd "$i"
  done
  wait_for "$NUM_OSDS OSDs up" all_osds_up
  ceph_ osd pool create cephfs_metadata 8 8 >/dev/null
  ceph_ osd pool create cephfs_data 16 16 >/dev/null
  ceph_ fs new cephfs cephfs_metadata cephfs_data >/dev/null
  mkdir -p "$dir/mds.a"
  ceph_ auth get-or-create mds.a mon 'allow profile mds' osd 'allow rw tag cephfs *=*' mds 'allow' \
    mgr 'allow profile mds' -o "$dir/mds.a/keyring"
  start_mds
  mkdir -p "$dir/rgw.a"
  ceph_ auth get-or-create client.rgw.a mon 'allow rw' osd 'allow rwx' mgr 'allow rw' -o "$dir/rgw.a/keyring"
  start_rgw
  wait_for "the MDS" mds_active
  wait_for "the mgr volumes module" fs_ready
  wait_for "radosgw" rgw_up
  local admin
  admin=$(timeout 60 radosgw-admin -c "$conf" -k "$dir/keyring" user create --uid=storefront-admin \
    --display-name="storefront admin" --caps='users=*;buckets=*;usage=*;metadata=*;zone=*')
  python3 - "$admin" > "$dir/rgw-admin.env" <<'EOF'
import json, sys
key = json.loads(sys.argv[1])["keys"][0]
print(f"CEPH_RGW_ACCESS_KEY={key['access_key']}\nCEPH_RGW_SECRET_KEY={key['secret_key']}")
EOF
  wait_for "all PGs active+clean" pgs_clean clean
  # Cached with the file system failed (no rank held by a gone daemon): a boot from the
  # cache makes it joinable and the fresh MDS takes rank 0 at once.
  ceph_ fs fail cephfs >/dev/null
}

retarget() {  # a copied cluster: new mon and RGW ports, the monitor's map rewritten
  local v2 v1 rgw
  v2=$(free_port); v1=$(free_port); rgw=$(free_port)
  write_conf "$v2" "$v1" "$rgw"
  ceph-mon -c "$conf" -i a --extract-monmap "$dir/monmap" 2>/dev/null
  monmaptool "$dir/monmap" --rm a >/dev/null
  monmaptool "$dir/monmap" --addv a "[v2:127.0.0.1:$v2,v1:127.0.0.1:$v1]" >/dev/null
  ceph-mon -c "$conf" -i a --inject-monmap "$dir/monmap" 2>/dev/null
  rm -f "$dir"/run/* "$dir"/log/*
}

stop_all() {  # every daemon at once (SIGTERM, SIGKILL after 10 s): a test cluster is disposable
  local pids=() f pid
  for f in "$dir"/run/*.pid; do
    [ -f "$f" ] || continue
    pid=$(cat "$f")
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then kill "$pid" 2>/dev/null && pids+=("$pid"); fi
    rm -f "$f"
  done
  for _ in $(seq 1 100); do
    local alive=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && return 0
    sleep 0.1
  done
  for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
}

boot() {
  local key cache
  key=$( (dpkg-query -W -f='${Version}' ceph-osd ceph-mon radosgw; declare -f write_conf make_cluster) | sha256sum | cut -c1-16)
  cache=$cache_root/ceph-cluster-$key.tar
  if [ -f "$cache" ]; then
    rm -rf "${dir:?}"/*
    tar -C "$dir" -xSf "$cache"
    retarget
    stage "copied from $cache"
    start_mon
    wait_for "the monitor" ceph_ mon stat
    stage "mon up"
    ceph_ fs set cephfs joinable true >/dev/null
    # Each daemon forks once it is initialised (an OSD mounts its store first): in parallel.
    start_mgr & start_mds & start_rgw &
    for i in $(seq 0 $((NUM_OSDS - 1))); do start_osd "$i" & done
    wait
    stage "daemons started"
    wait_for "$NUM_OSDS OSDs up" all_osds_up
    stage "OSDs up"
    wait_for "the MDS" mds_active
    stage "MDS active"
    wait_for "radosgw" rgw_up
    stage "RGW answers"
    wait_for "all PGs active" pgs_clean active
    stage "PGs active"
    wait_for "the mgr" mgr_active
    stage "mgr available"
    wait_for "the mgr volumes module" fs_ready
    stage "mgr volumes ready"
  else
    make_cluster
    stop_all
    mkdir -p "$cache_root"
    tar -C "$dir" -cSf "$cache.tmp.$$" --exclude=./run --exclude=./log . && mv "$cache.tmp.$$" "$cache"
    boot
    return
  fi
  env_lines > "$dir/env"
}

case $cmd in
  start)
    if [ -f "$dir/run/mon.a.pid" ] && kill -0 "$(pid_of mon.a)" 2>/dev/null; then
      echo "ceph-test-cluster: a cluster already runs in $dir" >&2; exit 1
    fi
    command -v ceph-mon >/dev/null || { echo "ceph-test-cluster: Ceph is not installed (scripts/install-ceph.sh)" >&2; exit 1; }
    trap 'rc=$?; [ $rc -eq 0 ] || stop_all; exit $rc' EXIT
    boot >&2
    trap - EXIT
    cat "$dir/env"
    ;;
  env) cat "$dir/env" ;;
  stop) stop_all ;;
  osd-stop) stop_daemon "osd.${3:?osd id}" ;;
  osd-start) start_osd "${3:?osd id}" ;;
  *) echo "unknown command $cmd" >&2; exit 2 ;;
esac
