#!/bin/sh
# Build (once) the root filesystem of the test instance image: a debootstrap minbase
# Debian bookworm with openssh-server, packed as a tarball for `docker import` (Docker Hub
# is not reachable from CI). The tarball is cached under $CACHE_DIR keyed by a hash of
# this recipe, so only the first run pays for debootstrap; CI may call this to pre-build.
# Prints the tarball's path on stdout.
#   usage: scripts/build-node-test-image.sh [CACHE_DIR]
set -eu
CACHE_DIR=${1:-${GPU_TEST_IMAGE_CACHE:-/var/cache/gpu-storefront-tests}}
MIRROR=${DEBIAN_MIRROR:-$(sed -n 's/^URIs: *\(http[^ ]*\/debian\)$/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n1)}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
SUITE=bookworm
PACKAGES=openssh-server

recipe_hash=$(sha256sum "$0" | cut -c1-16)
tarball="$CACHE_DIR/node-instance-$SUITE-$recipe_hash.tar"
if [ -s "$tarball" ]; then
    echo "$tarball"
    exit 0
fi

mkdir -p "$CACHE_DIR"
work=$(mktemp -d "$CACHE_DIR/build.XXXXXX")
trap 'rm -rf "$work"' EXIT
debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$work/rootfs" "$MIRROR" >&2
root="$work/rootfs"
# Host keys are generated when each instance starts (ssh-keygen -A): instances never
# share a host key, and none is baked into the image.
rm -f "$root"/etc/ssh/ssh_host_*
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
mkdir -p "$root/run/sshd" "$root/root/.ssh" "$root/workspace"
chmod 700 "$root/root/.ssh"
tar -C "$root" --numeric-owner -cf "$work/image.tar" .
mv "$work/image.tar" "$tarball"
echo "$tarball"
