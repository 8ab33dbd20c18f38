#!/usr/bin/env bash
# Installs what tests/nodeagent needs (idempotent; root): a Docker engine to run a private
# dockerd, debootstrap for the instance image, sshd/ssh, gcc for the NVML stub, iproute2
# and util-linux (ip netns, nsenter), nftables (the agent's packet filter) and e2fsprogs
# (the test dockerd's data root and the size-limited lease disks), restic (lease disk
# snapshots to the site's RGW), busybox-static (a customer image with no sshd and
# no libc, tests/nodeagent/runtime/test_customer_images.py); the `dockremap`
# user with subordinate uid/gid ranges for dockerd's userns-remap. Exits NON-ZERO when a tool cannot be installed, so
# CI fails here rather than later. Then pre-builds the cached instance image.
#   usage: scripts/install-node-tools.sh [--no-image]
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"

# package -> a command it provides
declare -A TOOLS=(
  [docker.io]=dockerd [debootstrap]=debootstrap [openssh-server]=sshd
  [openssh-client]=ssh [gcc]=gcc [iproute2]=ip [util-linux]=nsenter
  [nftables]=nft [e2fsprogs]=mkfs.ext4 [restic]=restic [busybox-static]=busybox
)

apt_retry() {   # apt may be locked by another apt run: wait and retry
  local attempt
  for attempt in $(seq 1 30); do
    if DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=60 "$@"; then
      return 0
    fi
    echo "install-node-tools: apt-get $* failed (attempt $attempt), retrying" >&2
    sleep 10
  done
  return 1
}

missing=()
for pkg in "${!TOOLS[@]}"; do
  command -v "${TOOLS[$pkg]}" >/dev/null 2>&1 || PATH="$PATH:/usr/sbin:/sbin" command -v "${TOOLS[$pkg]}" >/dev/null 2>&1 || missing+=("$pkg")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "install-node-tools: installing ${missing[*]}"
  apt_retry update -qq
  apt_retry install -y -qq --no-install-recommends "${missing[@]}"
fi
for pkg in "${!TOOLS[@]}"; do
  if ! PATH="$PATH:/usr/sbin:/sbin" command -v "${TOOLS[$pkg]}" >/dev/null 2>&1; then
    echo "install-node-tools: ${TOOLS[$pkg]} (from $pkg) is still missing" >&2
    exit 1
  fi
done
# dockerd --userns-remap=default maps container root to dockremap's subordinate range
# (nodeagent/README.md "Node setup"); made here so concurrent test daemons never race on it.
if ! getent passwd dockremap >/dev/null; then
  useradd --system --no-create-home --shell /usr/sbin/nologin dockremap
fi
for file in /etc/subuid /etc/subgid; do
  touch "$file"
  grep -q '^dockremap:' "$file" || echo 'dockremap:231072:65536' >> "$file"
done
if [ "${1:-}" != "--no-image" ]; then
  "$REPO/scripts/build-node-test-image.sh" >/dev/null
fi
echo "install-node-tools: ok"
