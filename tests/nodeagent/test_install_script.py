"""nodeagent/install-node.sh, the README's install as one script. It runs for
real, in a chroot and on the booted guest, in tests/nodeagent/test_node_in_a_box.py; here
what that test cannot see: the README shows what the script does, not something else."""
import json
import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "nodeagent" / "install-node.sh"
README = (ROOT / "nodeagent" / "README.md").read_text()


def test_the_readme_installs_the_packages_the_script_installs():
    packages = re.search(r'^PACKAGES="([^"]+)"', SCRIPT.read_text(), re.M).group(1).split()
    shown = re.search(r"^apt-get install (.+)$", README, re.M).group(1).split()
    assert shown == packages


def test_the_readme_shows_the_daemon_json_the_script_installs():
    shown = re.search(r"`nodeagent/docker-daemon.json`:\n\n```json\n(.*?)```", README, re.S).group(1)
    assert json.loads(shown) == json.loads((ROOT / "nodeagent" / "docker-daemon.json").read_text())
    assert json.loads(shown)["userns-remap"] == "default" and json.loads(shown)["iptables"] is False


def test_url_without_code_is_refused_before_anything_is_installed():
    result = subprocess.run(["sh", str(SCRIPT), "--url", "https://shop.example"],
                            capture_output=True, text=True)
    assert result.returncode == 64 and "--url and --code go together" in result.stderr


def test_an_unknown_option_is_refused():
    result = subprocess.run(["sh", str(SCRIPT), "--lease-drives", "/dev/nvme1n1"],
                            capture_output=True, text=True)
    assert result.returncode == 64 and "unknown option --lease-drives" in result.stderr


def _assignments(path: Path) -> dict[str, str]:
    """The sysctl.d file's settings, keyed as /proc/sys paths ("-": may be missing)."""
    settings = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith(("#", ";")):
            key, _, value = line.partition("=")
            settings[key.strip().lstrip("-").replace(".", "/")] = value.strip()
    return settings


def test_the_kernel_settings_the_script_installs_pass_the_agents_start_checks(tmp_path):
    from nodeagent import preflight
    from nodeagent.config import DockerConfig

    settings = _assignments(ROOT / "nodeagent" / "sysctl.conf")
    for key, value in settings.items():
        (tmp_path / key).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / key).write_text(value + "\n")
    old_docker = {"ServerVersion": "20.10.24", "SecurityOptions": ["name=seccomp,profile=default"]}
    assert preflight.io_uring(old_docker, tmp_path / "kernel/io_uring_disabled") is None
    # a 16-GPU node at the default pids_limit, with room to spare
    assert preflight.pid_max(DockerConfig().pids_limit, 16, tmp_path / "kernel/pid_max") is None
    assert int(settings["kernel/pid_max"]) == preflight.PID_MAX_SET_BY_INSTALLER


def test_the_script_installs_the_files_where_the_agents_fixes_say():
    from nodeagent import preflight

    script = SCRIPT.read_text()
    sysctl = re.search(r"^SYSCTL=(\S+)$", script, re.M).group(1)
    seccomp = re.search(r"^SECCOMP=(\S+)$", script, re.M).group(1)
    assert sysctl == preflight.SYSCTL_FILE
    assert 'install -m 0644 "$src/sysctl.conf" "$SYSCTL"' in script
    assert 'install -m 0644 "$src/seccomp-no-io-uring.json" "$SECCOMP"' in script
    old_kernel_fix = preflight.io_uring({"ServerVersion": "20.10.24", "SecurityOptions": []},
                                        Path("/nonexistent")).fix
    assert f'"seccomp-profile": "{seccomp}"' in old_kernel_fix
    # the profile is in place before dockerd is restarted with a daemon.json naming it
    assert script.index('"$SECCOMP"') < script.index("systemctl restart docker")
    # the /dev/char links are in place before the upgrade's daemon-reload could drop the GPUs
    rule = re.search(r"^UDEV_RULE=(\S+)$", script, re.M).group(1)
    assert rule == preflight.UDEV_RULE and rule in preflight.gpu_reload({"CgroupDriver": "systemd"}, "nvidia", {
        "nvidia0": os.makedev(195, 0)}, Path("/nonexistent")).fix
    assert 'install -D -m 0644 "$src/udev/71-nvidia-dev-char.rules" "$UDEV_RULE"' in script
    assert script.index('"$UDEV_RULE"') < script.index("systemctl daemon-reload")
    assert "create-dev-char-symlinks --create-all" in (ROOT / "nodeagent/udev/71-nvidia-dev-char.rules").read_text()
