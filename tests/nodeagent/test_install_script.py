"""nodeagent/install-node.sh, the README's install as one script (issue 23). It runs for
real, in a chroot and on the booted guest, in tests/nodeagent/test_node_in_a_box.py; here
what that test cannot see: the README shows what the script does, not something else."""
import json
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
