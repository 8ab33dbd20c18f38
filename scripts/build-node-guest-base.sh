#!/bin/sh
# The expensive, rarely changing half of the node in a box's guest image: a
# debootstrap of Debian bookworm as a GPU server's OS before the agent — systemd as PID 1,
# dockerd, the disk tools, chrony, nftables, sshd, python3-venv, a kernel and initramfs
# that boot on QEMU's virtio disk, systemd-networkd on the user-mode network. Packed as a
# tarball (numeric owners, xattrs) cached under $CACHE_DIR keyed by this recipe;
# scripts/build-node-guest-image.sh unpacks it and installs the agent on top (cheap,
# rebuilt whenever nodeagent/ changes). The .debs are cached too (guest-debs/): a recipe
# change rebuilds without downloading ~400 MB again.
# Prints the tarball's path on stdout.
#   usage: scripts/build-node-guest-base.sh [CACHE_DIR]
set -eu
CACHE_DIR=${1:-${GPU_TEST_IMAGE_CACHE:-/var/cache/gpu-storefront-tests}}
MIRROR=${DEBIAN_MIRROR:-$(sed -n 's/^URIs: *\(http[^ ]*\/debian\)$/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n1)}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
SUITE=bookworm
# What nodeagent/install-node.sh wants on a node (it installs only what is missing, so
# in the guest, which has no Internet, nothing), plus the OS and docker.io.
PACKAGES=systemd-sysv,udev,dbus,kmod,linux-image-amd64,initramfs-tools,iproute2,openssh-server,docker.io,cryptsetup-bin,lvm2,e2fsprogs,nvme-cli,util-linux,python3,python3-venv,ca-certificates,procps,nftables,chrony,apparmor

key=$(sha256sum "$0" | cut -c1-16)
tarball="$CACHE_DIR/node-guest-base-$SUITE-$key.tar"
if [ -s "$tarball" ]; then
    echo "$tarball"
    exit 0
fi
mkdir -p "$CACHE_DIR/guest-debs"
work=$(mktemp -d "$CACHE_DIR/guest-base.XXXXXX")
trap 'rm -rf "$work"' EXIT
root="$work/rootfs"
debootstrap --variant=minbase --cache-dir="$CACHE_DIR/guest-debs" --include="$PACKAGES" \
    "$SUITE" "$root" "$MIRROR" >&2

# Boot: root on the virtio disk, console on the serial port, systemd-networkd DHCP on
# QEMU's user-mode network (the host is 10.0.2.2 from the guest).
echo gpu-node > "$root/etc/hostname"
printf '127.0.0.1 localhost\n127.0.1.1 gpu-node\n' > "$root/etc/hosts"
echo '/dev/vda / ext4 defaults,errors=remount-ro 0 1' > "$root/etc/fstab"
mkdir -p "$root/etc/systemd/network"
printf '[Match]\nName=en* eth*\n[Network]\nDHCP=ipv4\n' > "$root/etc/systemd/network/10-user.network"
wants="$root/etc/systemd/system/multi-user.target.wants"
mkdir -p "$wants" "$root/etc/systemd/system/network-online.target.wants"
ln -sf /lib/systemd/system/systemd-networkd.service "$wants/"
ln -sf /lib/systemd/system/systemd-networkd-wait-online.service "$root/etc/systemd/system/network-online.target.wants/"
printf 'nameserver 10.0.2.3\n' > "$root/etc/resolv.conf"
# Nothing that wakes up to do housework during the test.
for unit in apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer \
            man-db.timer dpkg-db-backup.timer; do
    ln -sf /dev/null "$root/etc/systemd/system/$unit"
done
sed -i 's/^#\?PasswordAuthentication.*/PasswordAuthentication no/' "$root/etc/ssh/sshd_config"
rm -f "$root"/etc/ssh/ssh_host_*      # made per image (build-node-guest-image.sh)
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
tar -C "$root" --numeric-owner --xattrs --xattrs-include='*' -cf "$work/base.tar" .
mv "$work/base.tar" "$tarball"
# An older recipe's base is dead weight (~1 GB).
find "$CACHE_DIR" -maxdepth 1 -name 'node-guest-base-*.tar' ! -name "$(basename "$tarball")" -delete
echo "$tarball"
