#!/usr/bin/env bash
# Installs what the node agent's disk backend (nodeagent/disks) and its tests need.
# Root on Debian. Idempotent. Exits NON-ZERO when anything is missing at the end,
# so CI fails instead of silently skipping the disk tests.
#   cryptsetup-bin  cryptsetup (LUKS2 format/open/erase/dump)
#   nvme-cli        nvme id-ctrl / sanitize / sanitize-log / format
#   lvm2            the LVM carver (lvcreate/lvs/lvremove)
#   util-linux      blkdiscard, blockdev, losetup, lsblk;  e2fsprogs: mkfs.ext4, blkid
#   qemu-system-x86, busybox-static: the QEMU guest test (TCG, no KVM needed)
#   qemu-utils (qemu-img), debootstrap, gcc, openssh-client: the node-in-a-box guest (for
#     scripts/build-node-guest-image.sh, tests/nodeagent/test_node_in_a_box.py)
#   linux-image-amd64: only DOWNLOADED (apt-get download) into the test cache and unpacked
#     there by the test: installing a kernel on a CI container would run initramfs and
#     bootloader hooks for nothing; the guest needs only vmlinuz and a few modules.
set -euo pipefail

CACHE="${GPU_STOREFRONT_TEST_CACHE:-/var/cache/gpu-storefront-tests}"
PACKAGES=(cryptsetup-bin nvme-cli lvm2 util-linux e2fsprogs qemu-system-x86 qemu-utils busybox-static debootstrap gcc openssh-client)
COMMANDS=(cryptsetup nvme lvm blkdiscard blockdev losetup lsblk mkfs.ext4 blkid
          qemu-system-x86_64 qemu-img busybox dpkg-deb debootstrap gcc ssh ssh-keygen)
export DEBIAN_FRONTEND=noninteractive
APT_OPTS=(-o DPkg::Lock::Timeout=300 -o Acquire::Retries=3 -y -qq --no-install-recommends)

# Run an apt command, retrying while another apt/dpkg holds the lock (or a mirror hiccups).
apt_retry() {
  local attempt
  for attempt in 1 2 3 4 5 6; do
    if "$@"; then return 0; fi
    echo "install-disk-tools: '$*' failed (attempt $attempt); retrying in 10s" >&2
    sleep 10
  done
  return 1
}

missing=()
for pkg in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "install-disk-tools: installing ${missing[*]}"
  apt_retry apt-get -o DPkg::Lock::Timeout=300 -qq update
  apt_retry apt-get install "${APT_OPTS[@]}" "${missing[@]}" >/dev/null
fi

mkdir -p "$CACHE"
kernel_pkg="$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-/ {print $2; exit}')"
if [ -z "$kernel_pkg" ]; then
  apt_retry apt-get -o DPkg::Lock::Timeout=300 -qq update
  kernel_pkg="$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-/ {print $2; exit}')"
fi
[ -n "$kernel_pkg" ] || { echo "install-disk-tools: apt knows no linux-image-amd64" >&2; exit 1; }
if ! ls "$CACHE/${kernel_pkg}"_*.deb >/dev/null 2>&1; then
  echo "install-disk-tools: downloading $kernel_pkg into $CACHE"
  (cd "$CACHE" && apt_retry apt-get -o DPkg::Lock::Timeout=300 -qq download "$kernel_pkg")
fi

status=0
for cmd in "${COMMANDS[@]}"; do
  command -v "$cmd" >/dev/null 2>&1 || { echo "install-disk-tools: MISSING $cmd" >&2; status=1; }
done
ls "$CACHE/${kernel_pkg}"_*.deb >/dev/null 2>&1 || { echo "install-disk-tools: MISSING $kernel_pkg .deb" >&2; status=1; }
[ "$status" = 0 ] && echo "install-disk-tools: ok (kernel package $kernel_pkg in $CACHE)"
exit "$status"
