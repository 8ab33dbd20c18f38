#!/bin/sh
# Build (once) the "node in a box" (issue 23): the disk image of a Debian bookworm GPU
# server for QEMU (KVM, or TCG without /dev/kvm), booting with systemd as PID 1, with dockerd, the disk tools, sshd
# and python3-venv installed, but NOT the agent: the test installs it in the guest the way
# nodeagent/README.md says (its own venv, the shipped unit, systemctl enable).
# Also in the image, because the guest has no Internet: the agent's dependency wheels
# (/opt/wheelhouse, for `pip install --no-index --find-links`), the debootstrap instance
# image (scripts/build-node-test-image.sh) for `docker import`, and a stand-in
# libnvidia-ml.so.1 (tests/nodeagent/nvml_stub, built with gcc: the guest has no GPU).
# Cached under $CACHE_DIR/node-guest-<key>/ (root.img, vmlinuz, initrd.img, id_ed25519 for
# root's ssh), the key hashing this recipe, the stub and the agent's pins.
# Prints the directory on stdout.
#   usage: scripts/build-node-guest-image.sh [CACHE_DIR]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
CACHE_DIR=${1:-${GPU_TEST_IMAGE_CACHE:-/var/cache/gpu-storefront-tests}}
MIRROR=${DEBIAN_MIRROR:-$(sed -n 's/^URIs: *\(http[^ ]*\/debian\)$/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n1)}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
PYTHON=${PYTHON:-python3}
SUITE=bookworm
PACKAGES=systemd-sysv,udev,dbus,kmod,linux-image-amd64,initramfs-tools,iproute2,openssh-server,docker.io,cryptsetup-bin,lvm2,e2fsprogs,nvme-cli,util-linux,python3,python3-venv,ca-certificates,procps,nftables
STUB="$repo/tests/nodeagent/nvml_stub/nvml_stub.c"
PINS="$repo/nodeagent/pyproject.toml"

key=$(cat "$0" "$STUB" "$PINS" "$here/build-node-test-image.sh" | sha256sum | cut -c1-16)
out="$CACHE_DIR/node-guest-$key"
if [ -s "$out/root.img" ] && [ -s "$out/initrd.img" ]; then
    echo "$out"
    exit 0
fi
instance_tar=$("$here/build-node-test-image.sh" "$CACHE_DIR")

mkdir -p "$CACHE_DIR"
work=$(mktemp -d "$CACHE_DIR/guest-build.XXXXXX")
trap 'rm -rf "$work"' EXIT
root="$work/rootfs"
# The downloaded .debs are kept beside the images: a recipe change rebuilds without
# downloading the ~400 MB again.
mkdir -p "$CACHE_DIR/guest-debs"
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
            man-db.timer dpkg-db-backup.timer systemd-timesyncd.service; do
    ln -sf /dev/null "$root/etc/systemd/system/$unit"
done
# dockerd: the overlay2 driver on the ext4 root; no live-restore (a reboot is a reboot).
mkdir -p "$root/etc/docker"
printf '{"storage-driver": "overlay2", "log-driver": "json-file"}\n' > "$root/etc/docker/daemon.json"

# root logs in with the test's key only (no password).
ssh-keygen -q -t ed25519 -N '' -C gpu-node-test -f "$work/id_ed25519"
install -d -m 0700 "$root/root/.ssh"
install -m 0600 "$work/id_ed25519.pub" "$root/root/.ssh/authorized_keys"
sed -i 's/^#\?PasswordAuthentication.*/PasswordAuthentication no/' "$root/etc/ssh/sshd_config"

# What the guest cannot download: the agent's dependency wheels, the instance image, the
# stand-in NVML library.
deps=$("$PYTHON" -c 'import sys, tomllib; print(" ".join(tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]))' "$PINS")
# shellcheck disable=SC2086
"$PYTHON" -m pip download -q --only-binary=:all: --python-version 3.11 --platform manylinux2014_x86_64 \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --implementation cp \
    -d "$root/opt/wheelhouse" $deps "setuptools>=69" wheel >&2
cp "$instance_tar" "$root/opt/instance-image.tar"
mkdir -p "$root/opt/nvml-stub"
gcc -shared -fPIC -O2 -o "$root/opt/nvml-stub/libnvidia-ml.so.1" "$STUB"

rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
cp "$root"/boot/vmlinuz-* "$work/vmlinuz"
cp "$root"/boot/initrd.img-* "$work/initrd.img"
chmod 0644 "$work/vmlinuz" "$work/initrd.img"
mke2fs -q -t ext4 -L gpu-node-root -d "$root" "$work/root.img" 6G
mkdir -p "$work/out"
mv "$work/root.img" "$work/vmlinuz" "$work/initrd.img" "$work/id_ed25519" "$work/out/"
rm -rf "$out"
mv "$work/out" "$out"
echo "$out"
