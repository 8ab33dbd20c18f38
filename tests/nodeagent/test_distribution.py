"""The agent installs alone. `pip install ./nodeagent` (its own pyproject.toml)
into a fresh venv brings the agent and its four dependencies, and nothing of the
storefront (Django, Celery, web3, psycopg…); the storefront's `[agent]` extra pins the
same versions, so tests/nodeagent run what a node installs."""
import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
AGENT_DEPS = {"docker", "nvidia-ml-py", "cryptography", "requests"}


def _name(requirement: str) -> str:
    return re.split(r"[\[=<>!~; ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _pyprojects():
    root = tomllib.loads((ROOT / "pyproject.toml").read_text())
    agent = tomllib.loads((ROOT / "nodeagent" / "pyproject.toml").read_text())
    return root, agent


def test_the_agent_distribution_pins_exactly_the_agent_extra():
    root, agent = _pyprojects()
    pins = agent["project"]["dependencies"]
    assert {_name(p) for p in pins} == AGENT_DEPS
    assert all("==" in p for p in pins)
    assert sorted(pins) == sorted(root["project"]["optional-dependencies"]["agent"])
    assert agent["project"]["scripts"] == root["project"]["scripts"]


def test_pip_install_of_the_agent_brings_no_storefront_package(tmp_path):
    source = tmp_path / "src" / "nodeagent"
    shutil.copytree(ROOT / "nodeagent", source,
                    ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    install = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", str(source)],
                             capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stderr[-3000:]

    listed = subprocess.run([str(venv / "bin" / "pip"), "list", "--format", "json"],
                            capture_output=True, text=True, check=True).stdout
    installed = {p["name"].lower().replace("_", "-") for p in json.loads(listed)}
    root, _ = _pyprojects()
    storefront_only = {_name(r) for r in root["project"]["dependencies"]} - AGENT_DEPS
    assert "gpu-node-agent" in installed and AGENT_DEPS <= installed
    assert not storefront_only & installed, sorted(storefront_only & installed)
    assert not {"django", "celery", "web3", "psycopg", "gpu-storefront"} & installed

    # The console script runs from the venv, with the shipped files beside the code.
    version = subprocess.run([str(venv / "bin" / "gpu-node-agent"), "--version"],
                             capture_output=True, text=True, timeout=60)
    assert version.returncode == 0 and version.stdout.strip() == "0.1.0", version.stderr
    probe = ("import importlib.resources as r, json, nodeagent.disks, nodeagent.runtime.docker; "
             "f = r.files('nodeagent'); print(json.dumps([(f / n).is_file() for n in "
             "('README.md', 'PROTOCOL.md', 'config.example.toml', 'systemd/gpu-node-agent.service')]))")
    shipped = subprocess.run([str(venv / "bin" / "python"), "-c", probe], cwd=tmp_path,
                             capture_output=True, text=True, timeout=60)
    assert shipped.returncode == 0, shipped.stderr
    assert json.loads(shipped.stdout) == [True, True, True, True]
