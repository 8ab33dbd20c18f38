#!/usr/bin/env bash
# Ceph from Debian's packages for the storage tests (tests/storage): a single-host cluster
# (mon, mgr with its volumes module, bluestore OSDs on files, MDS, radosgw) and the
# clients the storefront and the node agent drive (ceph, radosgw-admin, ceph-fuse).
# Idempotent; root. Exits non-zero when an install fails or a tool is still missing.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/apt-lib.sh

apt_install_all ceph-mon ceph-mgr ceph-mgr-modules-core ceph-osd ceph-mds radosgw \
  ceph-fuse ceph-common python3-cephfs python3-rados python3-rbd python3-rgw fuse3 || exit 1
status=0
for tool in ceph ceph-mon ceph-mgr ceph-osd ceph-mds radosgw radosgw-admin ceph-fuse \
    ceph-authtool monmaptool; do
  command -v "$tool" >/dev/null || { echo "!! $tool missing after install" >&2; status=1; }
done
[ -d /usr/share/ceph/mgr/volumes ] || { echo "!! mgr volumes module missing" >&2; status=1; }
exit $status
