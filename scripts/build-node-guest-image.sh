#!/bin/sh
# Build (once per agent source) the "node in a box": the disk image of a Debian
# bookworm GPU server for QEMU, booting with systemd as PID 1, the node agent installed
# the way nodeagent/README.md says — by nodeagent/install-node.sh, run here in a chroot of
# the image (its own venv, pip from a wheelhouse, daemon.json with userns-remap, the
# dockremap ranges, nftables, the shipped unit enabled with systemctl). What needs the
# booted node (the volume group, enrolment, `images pull`, starting the unit) the test
# runs in the guest with the same script.
#
# Two cached stages, so that an agent change rebuilds in about a minute:
#   1. scripts/build-node-guest-base.sh: the debootstrap OS (minutes; its own key);
#   2. here: unpack it, the test's additions, install-node.sh in a chroot, `mke2fs -d`.
#      Keyed by this recipe, the base, the nodeagent/ sources, the NVML stub and the
#      instance image.
# Also in the image, because the guest has no Internet: the agent's dependency wheels
# (/opt/wheelhouse), the debootstrap instance image (scripts/build-node-test-image.sh)
# imported as gpu-node-test:box (the stand-in for a registry pull, see below), a
# stand-in libnvidia-ml.so.1 and libcuda.so.1 (tests/nodeagent/nvml_stub and cuda_stub,
# built with gcc: the GPU memory clearing routine runs against the latter) and stand-in GPU
# device nodes /dev/nvidia0..7 made by systemd-tmpfiles at every boot.
# Output: $CACHE_DIR/node-guest-<key>/ (root.img, vmlinuz, initrd.img, id_ed25519 for
# root's ssh); its path is the last line on stdout. Each stage's time goes to stderr.
#   usage: scripts/build-node-guest-image.sh [CACHE_DIR]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
CACHE_DIR=${1:-${GPU_TEST_IMAGE_CACHE:-/var/cache/gpu-storefront-tests}}
PYTHON=${PYTHON:-python3}
STUB="$repo/tests/nodeagent/nvml_stub/nvml_stub.c"
CUDA_STUB="$repo/tests/nodeagent/cuda_stub/cuda_stub.c"
PINS="$repo/nodeagent/pyproject.toml"
INSTANCE_REF=gpu-node-test:box      # the test's [images] entry
STAND_IN_MINORS="3 5 7 8 9 3 5 7"     # null, zero, full, random, urandom (private_dev.sh)
started=$(date +%s)
# One build at a time (two test processes, or CI beside a hand run): the second waits, then
# finds the first one's image instead of replacing it under a running guest.
mkdir -p "$CACHE_DIR"
exec 9>"$CACHE_DIR/node-guest-build.lock"
flock 9
took() { echo "node guest image: $1 ($(( $(date +%s) - started )) s so far)" >&2; }

base=$("$here/build-node-guest-base.sh" "$CACHE_DIR")
took "base $(basename "$base")"
instance_tar=$("$here/build-node-test-image.sh" "$CACHE_DIR")
took "instance image $(basename "$instance_tar")"

# The agent's dependency wheels, for the guest's offline pip (cached by the pins).
deps=$("$PYTHON" -c 'import sys, tomllib; print(" ".join(tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]))' "$PINS")
wheels="$CACHE_DIR/node-wheelhouse-$(echo "$deps" | sha256sum | cut -c1-16)"
if [ ! -e "$wheels/.complete" ]; then
    rm -rf "$wheels" && mkdir -p "$wheels"
    # shellcheck disable=SC2086
    "$PYTHON" -m pip download -q --only-binary=:all: --python-version 3.11 --platform manylinux2014_x86_64 \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --implementation cp \
        -d "$wheels" $deps "setuptools>=69" wheel >&2
    touch "$wheels/.complete"
    took "wheelhouse downloaded"
fi

agent_sources=$(cd "$repo/nodeagent" && find . -type f ! -path '*/__pycache__/*' ! -path './build/*' \
    ! -path '*.egg-info/*' -print | LC_ALL=C sort | xargs sha256sum | sha256sum)
key=$( { cat "$0" "$STUB" "$CUDA_STUB"; echo "$base $instance_tar $wheels $agent_sources"; } | sha256sum | cut -c1-16)
out="$CACHE_DIR/node-guest-$key"
if [ -s "$out/root.img" ] && [ -s "$out/initrd.img" ]; then
    took "cached $out"
    echo "$out"
    exit 0
fi

work=$(mktemp -d "$CACHE_DIR/guest-build.XXXXXX")
trap 'rm -rf "$work"' EXIT
root="$work/rootfs"
mkdir "$root"
tar -C "$root" --numeric-owner --xattrs --xattrs-include='*' -xpf "$base"
took "base unpacked"

# root logs in with the test's key only (no password); the image's own host keys.
ssh-keygen -q -t ed25519 -N '' -C gpu-node-test -f "$work/id_ed25519"
install -d -m 0700 "$root/root/.ssh"
install -m 0600 "$work/id_ed25519.pub" "$root/root/.ssh/authorized_keys"
ssh-keygen -q -A -f "$root"

# What the guest cannot download, and the stand-ins for what it does not have.
cp -r "$wheels" "$root/opt/wheelhouse"
mkdir -p "$root/opt/nvml-stub"
gcc -shared -fPIC -O2 -o "$root/opt/nvml-stub/libnvidia-ml.so.1" "$STUB"
gcc -shared -fPIC -O2 -o "$root/opt/nvml-stub/libcuda.so.1" "$CUDA_STUB"
i=0
for minor in $STAND_IN_MINORS; do
    echo "c /dev/nvidia$i 0666 root root - 1:$minor"
    i=$((i + 1))
done > "$root/etc/tmpfiles.d/stand-in-gpus.conf"

# The agent's checkout, and the README's install run in the image (offline: no running
# systemd, so the script stops before enrolment; the guest finishes it).
mkdir -p "$root/usr/src"
tar -C "$repo" --exclude=__pycache__ --exclude=build --exclude='*.egg-info' -cf - nodeagent \
    | tar -C "$root/usr/src" -xf -
unshare --mount --propagation private sh -eu -c '
    root=$1
    mount --rbind /dev "$root/dev"
    mount -t proc proc "$root/proc"
    mount -t sysfs sysfs "$root/sys"
    mount -t tmpfs tmpfs "$root/tmp"
    env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
        chroot "$root" /usr/src/nodeagent/install-node.sh --wheelhouse /opt/wheelhouse
' sh "$root" >&2
took "agent installed in a chroot (install-node.sh)"

# The instance image, imported by the image's own dockerd (docker.io of the guest, with the
# daemon.json and dockremap ranges just installed) run in the chroot: what `docker import`
# in the booted guest did in ~2 min under TCG takes seconds here. The guest then finds it
# present (`gpu-node-agent images pull`). / must be a mount point for docker-untar's
# pivot, and the chroot gets its own PID and network namespaces (bridge "none").
cp "$instance_tar" "$root/opt/instance-image.tar"
unshare --mount --net --pid --fork --propagation private sh -eu -c '
    root=$1 ref=$2
    mount --bind "$root" "$root"
    mount --rbind /dev "$root/dev"
    mount -t proc proc "$root/proc"
    mount --rbind /sys "$root/sys"
    mount -t tmpfs tmpfs "$root/run"
    mount -t tmpfs tmpfs "$root/tmp"
    docker() { chroot "$root" docker -H unix:///run/build-docker.sock "$@"; }
    chroot "$root" dockerd -H unix:///run/build-docker.sock --pidfile /run/build-docker.pid \
        > "$root/../dockerd.log" 2>&1 &
    for _ in $(seq 120); do docker version >/dev/null 2>&1 && break; sleep 0.5; done
    docker import /opt/instance-image.tar "$ref" >/dev/null
    docker image inspect "$ref" >/dev/null
    kill "$(cat "$root/run/build-docker.pid")"
    wait
' sh "$root" "$INSTANCE_REF" >&2 || { tail -n 20 "$work/dockerd.log" >&2; exit 1; }
rm -f "$root/opt/instance-image.tar"
took "instance image imported by the guest's dockerd in a chroot"

rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/root/.cache
cp "$root"/boot/vmlinuz-* "$work/vmlinuz"
cp "$root"/boot/initrd.img-* "$work/initrd.img"
chmod 0644 "$work/vmlinuz" "$work/initrd.img"
mke2fs -q -t ext4 -L gpu-node-root -d "$root" "$work/root.img" 6G
took "root.img written (mke2fs -d)"
mkdir -p "$work/out"
mv "$work/root.img" "$work/vmlinuz" "$work/initrd.img" "$work/id_ed25519" "$work/out/"
rm -rf "$out"
mv "$work/out" "$out"
# Images of older agent sources are dead weight (each ~1.5 GB): keep the base and this one.
find "$CACHE_DIR" -maxdepth 1 -type d -name 'node-guest-*' ! -name "$(basename "$out")" -mmin +60 \
    -exec rm -rf {} + 2>/dev/null || true
echo "$out"
