"""The sanitize polling loop. QEMU's emulated controller (and this CI host) has no Sanitize
command (recorded id-ctrl: sanicap 0), so a scripted `nvme` executable on PATH plays a
drive whose sanitize log goes in-progress -> done (or -> failed). It checks our side:
the commands issued, every poll recorded, completion and failure handling."""
import os
import stat

import pytest

from nodeagent.disks.runner import Runner
from nodeagent.disks.wipe import sanitize
from nodeagent.interfaces import OperationFailed

SCRIPTED_NVME = """#!/bin/sh
echo "$*" >> "{log}"
case "$1" in
  sanitize) exit 0 ;;
  sanitize-log)
    n=$(cat "{counter}" 2>/dev/null || echo 0); n=$((n + 1)); echo $n > "{counter}"
    if [ $n -lt 3 ]; then echo '{{"nvme9": {{"sprog": '$((n * 20000))', "sstat": 2}}}}'
    else echo '{{"nvme9": {{"sprog": 65535, "sstat": {final}}}}}'; fi ;;
esac
"""


@pytest.fixture
def scripted_nvme(tmp_path, monkeypatch):
    def install(final_status: int):
        script = tmp_path / "bin" / "nvme"
        script.parent.mkdir(exist_ok=True)
        script.write_text(SCRIPTED_NVME.format(log=tmp_path / "calls.log", counter=tmp_path / "polls",
                                               final=final_status))
        script.chmod(script.stat().st_mode | stat.S_IEXEC)
        monkeypatch.setenv("PATH", f"{script.parent}{os.pathsep}{os.environ['PATH']}")
        return tmp_path / "calls.log"
    return install


def test_crypto_erase_sanitize_is_polled_until_done(scripted_nvme):
    calls = scripted_nvme(final_status=1)
    runner = Runner()

    result = sanitize(runner, "/dev/nvme9n1", 4, poll_s=0)

    assert result == {"sanact": 4, "sanitize_status": 1, "polls": 3}
    assert calls.read_text().splitlines() == ["sanitize /dev/nvme9 --sanact=4"] + \
        ["sanitize-log /dev/nvme9 -o json"] * 3
    assert [c.argv[:2] for c in runner.commands] == [["nvme", "sanitize"]] + [["nvme", "sanitize-log"]] * 3


def test_a_failed_sanitize_raises(scripted_nvme):
    scripted_nvme(final_status=3)
    with pytest.raises(OperationFailed, match="reported failure"):
        sanitize(Runner(), "/dev/nvme9n1", 2, poll_s=0)


def test_sanitize_refuses_a_device_that_is_not_a_namespace():
    runner = Runner()
    with pytest.raises(OperationFailed, match="not an NVMe namespace"):
        sanitize(runner, "/dev/loop0", 4)
    assert not runner.commands
