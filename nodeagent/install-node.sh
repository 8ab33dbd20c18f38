#!/bin/sh
# Install the GPU node agent on a GPU server: the steps of nodeagent/README.md ("Install on
# a GPU server", "Node setup for isolation") as one script, run as root from a checkout:
#
#   nodeagent/install-node.sh [--wheelhouse DIR] [--config FILE] \
#       [--lease-drive /dev/nvme1n1 ...] [--volume-group gpu-leases] [--url URL --code CODE]
#
# Every step checks first and does only what is missing, so running it again (after an
# upgrade of the checkout, or with the enrolment code later) is safe. Steps that need the
# running node (restarting dockerd, the volume group, enrolment, `images pull`, starting
# the service) run only when systemd is running and their options are given: the same
# script prepares an OS image offline in a chroot (the node in a box's image build does
# exactly that, tests/nodeagent/test_node_in_a_box.py), then finishes on the booted node.
#
#   --wheelhouse DIR   install the agent's dependencies from DIR only (no index: offline)
#   --config FILE      install FILE as /etc/gpu-node-agent/config.toml (default: the
#                      example, when there is none yet; edit it: [disks], [images], ports)
#   --lease-drive DEV  a drive for the lease volume group (repeatable; never the OS disk)
#   --volume-group VG  its name (default gpu-leases; must match [disks] volume_group)
#   --url, --code      the storefront and the one-time enrolment code from the admin:
#                      enrol, pull the configured images, enable and start the service
set -eu
src=$(cd "$(dirname "$0")" && pwd)
VENV=/opt/gpu-node-agent
ETC=/etc/gpu-node-agent
UNIT=/etc/systemd/system/gpu-node-agent.service
SYSCTL=/etc/sysctl.d/60-gpu-node-agent.conf
SECCOMP=/etc/docker/gpu-node-seccomp.json
UDEV_RULE=/etc/udev/rules.d/71-nvidia-dev-char.rules
# the disk tools (luks backend, LVM carver, NVMe sanitize), venv, NTP, nft, and AppArmor
# (dockerd loads its docker-default profile into every container where the kernel has it), and
# openssh-server: its sshd, copied with its libraries, is how SSH gets into an image without one
# (nodeagent/runtime/ssh_bundle.py; operators reach nodes over it already)
PACKAGES="cryptsetup-bin lvm2 nvme-cli e2fsprogs util-linux python3-venv chrony nftables apparmor openssh-server"
DOCKREMAP_RANGE=231072:65536

wheelhouse='' config='' drives='' vg=gpu-leases url='' code=''
while [ $# -gt 0 ]; do
    case "$1" in
        --wheelhouse) wheelhouse=$2; shift 2 ;;
        --config) config=$2; shift 2 ;;
        --lease-drive) drives="$drives $2"; shift 2 ;;
        --volume-group) vg=$2; shift 2 ;;
        --url) url=$2; shift 2 ;;
        --code) code=$2; shift 2 ;;
        -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
        *) echo "install-node.sh: unknown option $1 (--help)" >&2; exit 64 ;;
    esac
done
if { [ -n "$url" ] && [ -z "$code" ]; } || { [ -z "$url" ] && [ -n "$code" ]; }; then
    echo "install-node.sh: --url and --code go together" >&2; exit 64
fi
[ "$(id -u)" = 0 ] || { echo "install-node.sh: run as root" >&2; exit 1; }
step() { echo "install-node: $*"; }
# systemd is PID 1 and running (not a chroot, not an image build): services can be
# (re)started, drives and the storefront reached.
running() { [ -d /run/systemd/system ]; }

# 1. The disk tools, the venv module, NTP (the storefront refuses reports more than
#    5 minutes off) and nftables. Docker Engine (and on a GPU server the NVIDIA Container
#    Toolkit) are prerequisites, not installed here.
command -v dockerd >/dev/null || { echo "install-node.sh: install Docker Engine first" >&2; exit 1; }
missing=''
for package in $PACKAGES; do
    dpkg-query -W -f '${Status}\n' "$package" 2>/dev/null | grep -q ' installed$' || missing="$missing $package"
done
if [ -n "$missing" ]; then
    step "installing$missing"
    # shellcheck disable=SC2086
    DEBIAN_FRONTEND=noninteractive apt-get install -y $missing
fi
systemctl enable -q chrony
running && systemctl start chrony

# 2. Node setup for isolation: dockerd with userns-remap (the dockremap ranges), without
#    iptables (the agent's nftables table is the lease filter), the userland proxy
#    publishing the ssh ports; nftables loads the agent's table at boot.
id dockremap >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin dockremap
for ids in /etc/subuid /etc/subgid; do
    grep -q '^dockremap:' "$ids" 2>/dev/null || echo "dockremap:$DOCKREMAP_RANGE" >> "$ids"
done
install -d -m 0755 /etc/docker
# The seccomp profile that denies io_uring where the kernel cannot turn it off (moby's
# default profile; docs/adr/0004-node-start-checks.md), before a daemon.json that names it.
cmp -s "$src/seccomp-no-io-uring.json" "$SECCOMP" || install -m 0644 "$src/seccomp-no-io-uring.json" "$SECCOMP"
if ! cmp -s "$src/docker-daemon.json" /etc/docker/daemon.json; then
    if [ -e /etc/docker/daemon.json ] && [ ! -e /etc/docker/daemon.json.before-gpu-node-agent ]; then
        cp -p /etc/docker/daemon.json /etc/docker/daemon.json.before-gpu-node-agent
        step "kept the old /etc/docker/daemon.json as daemon.json.before-gpu-node-agent"
    fi
    install -m 0644 "$src/docker-daemon.json" /etc/docker/daemon.json
    step "wrote /etc/docker/daemon.json"
    if running; then
        systemctl restart docker
    fi
fi
# The kernel settings the agent checks at start (nodeagent/sysctl.conf): io_uring off, a
# pid space for every instance's pids_limit. Applied now on a running node, at boot after.
if ! cmp -s "$src/sysctl.conf" "$SYSCTL"; then
    install -m 0644 "$src/sysctl.conf" "$SYSCTL"
    step "wrote $SYSCTL"
fi
if running; then
    sysctl_bin=/usr/lib/systemd/systemd-sysctl
    [ -x "$sysctl_bin" ] || sysctl_bin=/lib/systemd/systemd-sysctl
    "$sysctl_bin" "$SYSCTL"
fi
# GPUs that stay attached across a daemon-reload (this script runs one below on an upgrade):
# NVIDIA's udev rule links every NVIDIA device node as /dev/char/MAJOR:MINOR when the driver
# binds, and the links are made now where the toolkit and the driver are there
# (docs/adr/0013-burn-in-by-card-class.md; the agent checks them at start: gpu_reload).
if ! cmp -s "$src/udev/71-nvidia-dev-char.rules" "$UDEV_RULE"; then
    install -D -m 0644 "$src/udev/71-nvidia-dev-char.rules" "$UDEV_RULE"
    step "wrote $UDEV_RULE"
fi
if command -v nvidia-ctk >/dev/null 2>&1 && [ -e /dev/nvidiactl ]; then
    nvidia-ctk system create-dev-char-symlinks --create-all >/dev/null
fi
include='include "/var/lib/gpu-node-agent/runtime/*.nft"'
grep -qxF "$include" /etc/nftables.conf 2>/dev/null || echo "$include" >> /etc/nftables.conf
systemctl enable -q nftables

# 3. The agent in its own venv (Debian/Ubuntu: system pip is externally managed). The
#    venv remembers which source it was built from: an unchanged checkout is not
#    reinstalled.
source_id=$(cd "$src" && find . -type f ! -path '*/__pycache__/*' ! -path './build/*' \
    ! -path '*.egg-info/*' -print | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-16)
reinstalled=no
if [ "$(cat "$VENV/.installed-from" 2>/dev/null)" != "$source_id" ]; then
    step "installing the agent into $VENV"
    [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
    if [ -n "$wheelhouse" ]; then
        "$VENV/bin/pip" install -q --no-index --find-links "$wheelhouse" "$src"
    else
        "$VENV/bin/pip" install -q "$src"
    fi
    echo "$source_id" > "$VENV/.installed-from"
    reinstalled=yes
fi
ln -sf "$VENV/bin/gpu-node-agent" /usr/local/bin/gpu-node-agent
install -D -m 0644 "$src/README.md" /usr/share/doc/gpu-node-agent/README.md
install -d -m 0755 "$ETC"
if [ -n "$config" ]; then
    install -m 0644 "$config" "$ETC/config.toml"
elif [ ! -e "$ETC/config.toml" ]; then
    install -m 0644 "$src/config.example.toml" "$ETC/config.toml"
    step "wrote the example $ETC/config.toml: edit it ([disks], [images], public_host, port_range)"
fi
# The agent's packet filter before the agent ever ran: its table with no lease (the forward
# chain's policy drop: dockerd turns on ip_forward even without iptables, and the node must
# not route between its networks), loaded at boot through the include above, and now
# unless the agent's own table is already there. The agent replaces the file when it runs.
boot_table=/var/lib/gpu-node-agent/runtime/nftables.nft
if [ ! -e "$boot_table" ]; then
    install -d -m 0700 /var/lib/gpu-node-agent
    "$VENV/bin/python" -m nodeagent --config "$ETC/config.toml" boot-filter --write "$boot_table"
    step "wrote $boot_table (the packet filter nftables.service loads at boot)"
fi
if running && ! nft list table inet gpu_node_agent >/dev/null 2>&1; then
    nft -f "$boot_table"
    step "loaded the packet filter: the node forwards only the leases' own traffic"
fi

# 4. The shipped unit, enabled (started below once the node is enrolled).
if ! cmp -s "$src/systemd/gpu-node-agent.service" "$UNIT"; then
    install -m 0644 "$src/systemd/gpu-node-agent.service" "$UNIT"
    running && systemctl daemon-reload
fi
systemctl enable -q gpu-node-agent

# 5. The lease volume group (disk_backend = "luks", carver = "lvm").
if [ -n "$drives" ] && ! vgs "$vg" >/dev/null 2>&1; then
    step "volume group $vg on$drives"
    # shellcheck disable=SC2086
    pvcreate -q $drives && vgcreate -q "$vg" $drives
fi

# 6. Enrol, pull the configured images, start. The disk key-encryption key (KEK): see
#    nodeagent/README.md step 4 (TPM2 credential, or a file off the state directory).
if ! running; then
    step "installed (no running systemd: the node finishes with --url/--code once booted)"
    exit 0
fi
if [ -n "$url" ] && ! gpu-node-agent status >/dev/null 2>&1; then
    gpu-node-agent enrol --url "$url" --code "$code"
fi
if gpu-node-agent status >/dev/null 2>&1; then
    gpu-node-agent images pull
    if [ "$reinstalled" = yes ] && systemctl -q is-active gpu-node-agent; then
        systemctl restart gpu-node-agent
    else
        systemctl start gpu-node-agent
    fi
    step "gpu-node-agent enabled and started"
else
    step "installed, not enrolled: run again with --url and --code (from the admin)"
fi
