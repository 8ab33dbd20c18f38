"""`gpu-rent cp` against a real sshd (tests/automation/sshd.py: a throwaway OpenSSH server on a
free port with its own host key and authorized_keys), reached as the API tells the client: a
lease of the live test storefront whose SSH host and port are that sshd's. Bytes sent are
counted on the server's side (its SFTP server's log), not taken from the client's word."""
import getpass
import hashlib
import json
import os
import pty
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from django.utils import timezone
from gpu_rent import errors

from billing.services import checkout_place_order
from inventory.models import Offer, Site
from rental.models import Image, Lease
from tests.deadlines import Deadline, scaled, wait_for
from tests.tools import require

from .helpers import CLI_DIR, KEY, active_lease, login
from .sshd import Sshd, held_open, keygen

pytestmark = pytest.mark.django_db(transaction=True)

MiB = 1024 * 1024
USER = "root" if os.geteuid() == 0 else getpass.getuser()   # sshd not run as root logs in only its own user


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def box(tmp_path, monkeypatch):
    """The instance: an sshd that takes the test's key, and a directory on it for the files."""
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)   # the runner's agent keys are not the lease's
    key = keygen(tmp_path / "id_test")
    server = Sshd(tmp_path / "sshd", (tmp_path / "id_test.pub").read_text()).start()
    server.key = key
    server.files = tmp_path / "instance"
    server.files.mkdir()
    yield server
    server.stop()


@pytest.fixture
def lease(box, customer):
    """An active lease of the customer's whose SSH host and port are the box's."""
    lease = active_lease(customer, timezone.now())
    Lease.objects.filter(pk=lease.pk).update(host="127.0.0.1", ssh_port=box.port)
    return lease


def cp(cli, box, *args):  # noqa: F811
    return cli("cp", "-i", str(box.key), "--user", USER, *args)


def cp_json(cli, box, *args):  # noqa: F811
    code, out, err = cp(cli, box, *args, "--json")
    assert code == 0, err
    return json.loads(out)


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_upload_and_download_a_file_and_a_tree_byte_for_byte(cli, catalog, customer, lease, box, tmp_path):  # noqa: F811
    login(cli, customer)
    local = tmp_path / "local"
    (local / "data" / "sub" / "deeper").mkdir(parents=True)
    (local / "model.bin").write_bytes(os.urandom(3 * MiB + 17))
    (local / "data" / "a.bin").write_bytes(os.urandom(MiB))
    (local / "data" / "sub" / "notes with space.txt").write_text("résumé\n")
    (local / "data" / "sub" / "deeper" / "empty").write_bytes(b"")
    (local / "data" / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (local / "data" / "run.sh").chmod(0o755)

    code, _out, err = cp(cli, box, str(local / "model.bin"), f"{lease.pk}:{box.files}/")
    assert code == 0, err
    assert (box.files / "model.bin").read_bytes() == (local / "model.bin").read_bytes()
    assert int((box.files / "model.bin").stat().st_mtime) == int((local / "model.bin").stat().st_mtime)
    assert f"lease #{lease.pk}" in err and "trusting its host key" in err and "SHA256:" in err   # first use, said
    expected = {**tree(local / "data"), "link.bin": (local / "data" / "a.bin").read_bytes()}
    (local / "data" / "link.bin").symlink_to("a.bin")       # followed, like scp -r
    (local / "data" / "sub" / "up").symlink_to("..")        # a loop: visited once
    code, out, err = cp(cli, box, "-r", str(local / "data"), f"{lease.pk}:{box.files}", "--json")
    report = json.loads(out)
    assert code == 0 and tree(box.files / "data") == expected   # into DST/NAME, like rsync
    assert "a link to a directory already copied" in err and not (box.files / "data" / "sub" / "up").exists()
    assert report["copied"] == 5 and report["sent_bytes"] == sum(map(len, expected.values()))
    assert report["host_key"]["first_use"] is False    # kept from the first copy
    assert (box.files / "data" / "run.sh").stat().st_mode & 0o777 == 0o755
    assert not list(box.files.rglob("*.gpu-rent-part"))

    written = box.written()
    again = cp_json(cli, box, "-r", str(local / "data"), f"{lease.pk}:{box.files}")
    assert again["copied"] == 0 and again["up_to_date"] == 5 and again["sent_bytes"] == 0
    assert box.written() == written     # the server wrote nothing the second time

    back = tmp_path / "back"
    back.mkdir()
    assert cp(cli, box, f"{lease.pk}:{box.files}/model.bin", str(back / "renamed.bin"))[0] == 0
    assert sha(back / "renamed.bin") == sha(local / "model.bin")
    code, _out, err = cp(cli, box, "-r", "-q", f"{lease.pk}:{box.files}/data/", str(back / "contents"))
    assert code == 0 and err == ""     # quiet: nothing at all
    assert tree(back / "contents") == expected   # SRC/ copies what is in it
    assert (back / "contents" / "run.sh").stat().st_mode & 0o777 == 0o755


def _subprocess_env(cli):  # noqa: F811
    path = os.pathsep.join(p for p in [str(CLI_DIR), os.environ.get("PYTHONPATH", "")] if p)
    env = {**os.environ, "GPU_RENT_CONFIG_DIR": str(cli.config), "PYTHONPATH": path}
    env.pop("SSH_AUTH_SOCK", None)
    return env


def start_copy(cli, box, *args, stderr=subprocess.PIPE) -> subprocess.Popen:  # noqa: F811
    """`gpu-rent cp ARGS` as its own process, at 1 MiB/s (slow enough to be caught mid-way)."""
    return subprocess.Popen([sys.executable, "-m", "gpu_rent", "cp", "-i", str(box.key), "--user", USER,
                             "--limit-rate", "1M", *args], env=_subprocess_env(cli), stdout=subprocess.PIPE,
                            stderr=stderr)


def interrupt(cli, box, source: str, destination: str, part: Path, at_least: int, on_instance: Path) -> int:  # noqa: F811
    """Starts a rate-limited copy as its own process, kills it (SIGKILL: no clean-up) once the
    destination's part file holds `at_least` bytes, waits until the instance's side has let go
    of `on_instance` (the file it was writing or reading), and returns what the part holds."""
    proc = start_copy(cli, box, "-q", source, destination)
    try:
        wait_for(lambda: part.exists() and part.stat().st_size >= at_least, 60, f"{part} to reach {at_least} bytes",
                 alive=[proc], detail=lambda: proc.stderr.read1().decode() if proc.poll() is not None else "")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=scaled(30))
    # the instance's side has let go of the files: what the part holds now is final
    wait_for(lambda: not held_open(on_instance), 30, f"the killed copy's SFTP server to let go of {on_instance}")
    return part.stat().st_size


def test_an_interrupted_upload_resumes_and_sends_only_the_rest(cli, catalog, customer, lease, box, tmp_path):  # noqa: F811
    login(cli, customer)
    source = tmp_path / "big.bin"
    source.write_bytes(os.urandom(8 * MiB + 1234))
    size, dest = source.stat().st_size, box.files / "big.bin"
    part = box.files / "big.bin.gpu-rent-part"
    interrupt(cli, box, str(source), f"{lease.pk}:{dest}", part, 2 * MiB, part)
    kept = part.stat().st_size
    assert 2 * MiB <= kept < size and not dest.exists()

    report = cp_json(cli, box, str(source), f"{lease.pk}:{dest}")
    [done] = report["files"]
    assert done["status"] == "resumed" and done["resumed_from"] == kept and done["sent"] == size - kept
    assert [c["written"] for c in box.closes(part, forced=False)] == [size - kept]   # the server's count: the rest
    assert sha(dest) == sha(source) and not part.exists()


def test_a_source_changed_between_the_runs_is_copied_again_from_the_start(cli, catalog, customer, lease, box,  # noqa: F811
                                                                          tmp_path):
    login(cli, customer)
    source = tmp_path / "big.bin"
    source.write_bytes(os.urandom(6 * MiB))
    size, dest = source.stat().st_size, box.files / "big.bin"
    part = box.files / "big.bin.gpu-rent-part"
    interrupt(cli, box, str(source), f"{lease.pk}:{dest}", part, MiB, part)
    with open(source, "r+b") as handle:        # same size, one byte inside what was copied
        handle.seek(1000)
        flipped = handle.read(1)[0] ^ 0xFF
        handle.seek(1000)                        # the read moved on: write the byte it read
        handle.write(bytes([flipped]))

    code, out, err = cp(cli, box, str(source), f"{lease.pk}:{dest}", "--json")
    [done] = json.loads(out)["files"]
    assert code == 0 and done["status"] == "restarted" and done["sent"] == size and done["resumed_from"] == 0
    assert "changed since the interrupted copy" in err
    assert [c["written"] for c in box.closes(part, forced=False)] == [size]
    assert sha(dest) == sha(source)


@pytest.mark.parametrize("shell_tools", [True, False], ids=["hashed-on-the-instance", "image-without-sha256sum"])
def test_an_interrupted_download_resumes_and_reads_only_the_rest(cli, catalog, customer, lease, box, tmp_path,  # noqa: F811
                                                                 shell_tools):
    login(cli, customer)
    if not shell_tools:     # the commands find no head or sha256sum: the prefix is read back over SFTP
        box.stop()
        box.extra = ["SetEnv PATH=/nonexistent"]
        box.start()
    source = box.files / "checkpoint.pt"
    source.write_bytes(os.urandom(8 * MiB + 99))
    size, local = source.stat().st_size, tmp_path / "down"
    local.mkdir()
    part = local / "checkpoint.pt.gpu-rent-part"
    kept = interrupt(cli, box, f"{lease.pk}:{source}", str(local), part, 2 * MiB, source)
    assert 2 * MiB <= kept < size
    report = cp_json(cli, box, f"{lease.pk}:{source}", str(local))
    [done] = report["files"]
    assert done["status"] == "resumed" and done["resumed_from"] == kept and done["sent"] == size - kept
    reads = [close["read"] for close in box.closes(source, forced=False)]   # the killed copy never closed it
    assert reads == ([size - kept] if shell_tools else [kept, size - kept])   # hashed there, or read back once
    assert sha(local / "checkpoint.pt") == sha(source) and not part.exists()


def test_a_dropped_link_exits_30_and_the_same_command_then_resumes(cli, catalog, customer, lease, box,  # noqa: F811
                                                                   tmp_path):
    login(cli, customer)
    source = tmp_path / "big.bin"
    source.write_bytes(os.urandom(5 * MiB))
    dest, part = box.files / "big.bin", box.files / "big.bin.gpu-rent-part"
    proc = start_copy(cli, box, str(source), f"{lease.pk}:{dest}")
    wait_for(lambda: part.exists() and part.stat().st_size >= MiB, 60, "the copy to be under way", alive=[proc])
    assert box.kill_sessions() >= 1          # the instance's side of the link goes away
    _out, err = proc.communicate(timeout=scaled(60))
    assert proc.returncode == errors.SSH_FAILED, err
    assert f"The SSH connection to lease #{lease.pk} broke (big.bin)" in err.decode()
    assert "run the same command again" in err.decode() and "Traceback" not in err.decode()
    wait_for(lambda: not held_open(part), 30, "the killed session to let go of the part")
    [done] = cp_json(cli, box, str(source), f"{lease.pk}:{dest}")["files"]
    assert done["status"] == "resumed" and done["resumed_from"] > 0 and sha(dest) == sha(source)


def test_a_terminal_shows_progress(cli, catalog, customer, lease, box, tmp_path):  # noqa: F811
    login(cli, customer)
    source = tmp_path / "shown.bin"
    source.write_bytes(os.urandom(MiB))
    master, terminal = pty.openpty()
    proc = start_copy(cli, box, str(source), f"{lease.pk}:{box.files}/", stderr=terminal)
    os.close(terminal)
    shown, deadline = b"", Deadline(60)
    while not deadline.expired():
        if not select.select([master], [], [], deadline.remaining())[0]:
            break
        try:
            data = os.read(master, 4096)
        except OSError:     # EIO: the copy has closed the terminal (it exited)
            break
        shown += data
    os.close(master)
    assert proc.wait(timeout=scaled(30)) == 0
    text = shown.decode(errors="replace")
    lines = [line for line in text.split("\r") if "shown.bin" in line]
    assert len(lines) >= 3 and "100%" in lines[-1] and "/s" in lines[-1]   # redrawn as it went (1 s at 1 MiB/s)
    assert "1 file(s) copied" in text


def test_a_wrong_key_and_a_changed_host_key_are_refused_with_their_exit_codes(cli, catalog, customer, lease, box,  # noqa: F811
                                                                               tmp_path):
    login(cli, customer)
    (tmp_path / "f.txt").write_text("x")
    wrong = keygen(tmp_path / "id_other")
    code, _out, err = cli("cp", "-i", str(wrong), "--user", USER, str(tmp_path / "f.txt"), f"{lease.pk}:{box.files}/")
    assert code == errors.SSH_AUTH and "refused the key" in err and str(wrong) in err
    assert not (box.files / "f.txt").exists()
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "secret", "-f", str(tmp_path / "id_locked")], check=True,
                   timeout=scaled(30))
    code, _out, err = cli("cp", "-i", str(tmp_path / "id_locked"), str(tmp_path / "f.txt"), f"{lease.pk}:/tmp/")
    assert code == errors.SSH_AUTH and "protected by a passphrase" in err and "ssh-agent" in err   # no terminal to ask on

    assert cp(cli, box, str(tmp_path / "f.txt"), f"{lease.pk}:{box.files}/")[0] == 0   # trusted on first use
    known = (cli.config / "known_hosts").read_text()
    assert known.startswith(f"lease-{lease.pk}@[127.0.0.1]:{box.port} ssh-ed25519 ")
    box.stop()
    box.new_host_key()                # the same lease and address, another machine answering
    box.start()
    (tmp_path / "f.txt").write_text("changed")
    code, out, err = cp(cli, box, str(tmp_path / "f.txt"), f"{lease.pk}:{box.files}/", "--json")
    assert code == errors.HOST_KEY and json.loads(out)["error"] == "host_key_changed"
    assert "not the one kept" in err and f"lease-{lease.pk}@" in err
    assert (box.files / "f.txt").read_text() == "x" and (cli.config / "known_hosts").read_text() == known


def test_usual_failures_have_clear_messages_and_exit_codes(cli, catalog, customer, lease, box, tmp_path):  # noqa: F811
    login(cli, customer)
    (tmp_path / "dir").mkdir()
    code, _out, err = cp(cli, box, f"{lease.pk}:{box.files}/nothing-here", str(tmp_path))
    assert code == errors.NOT_FOUND and f"No such file or directory: {lease.pk}:{box.files}/nothing-here" in err
    code, _out, err = cp(cli, box, str(tmp_path / "missing"), f"{lease.pk}:{box.files}/")
    assert code == errors.NOT_FOUND and "missing" in err
    code, _out, err = cp(cli, box, str(tmp_path / "dir"), f"{lease.pk}:{box.files}/")
    assert code == errors.USAGE and "add -r" in err
    code, _out, err = cp(cli, box, str(tmp_path / "dir"), str(tmp_path / "elsewhere"))
    assert code == errors.USAGE and "Exactly one of SRC and DST" in err
    (tmp_path / "f").write_text("x")
    code, _out, err = cp(cli, box, str(tmp_path / "f"), f"{lease.pk}:{box.files}/no/such/dir/f")
    assert code == errors.NOT_FOUND and "No such directory" in err
    assert cp(cli, box, str(tmp_path / "f"), "999999:/tmp/")[0] == errors.NOT_FOUND   # no such lease (or not yours)

    pending, _invoice = checkout_place_order(
        customer=customer, offer=Offer.objects.get(slug="rtx-3090"), site=Site.objects.get(code="DFW-1"), term="week",
        image=Image.objects.get(slug="pytorch-2.5-cuda-12.4"), ssh_public_key=KEY, pay_from_balance=False,
        now=timezone.now())
    code, out, err = cp(cli, box, str(tmp_path / "f"), f"{pending.pk}:/tmp/", "--json")
    assert code == errors.REFUSED and json.loads(out)["error"] == "not_running" and "pending" in err


@pytest.fixture
def tiny_disk(tmp_path):
    """A 1 MiB tmpfs, mounted for the test (root, and a kernel that lets it)."""
    def mount(path: Path) -> Path:
        path.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(path)], capture_output=True,
                              text=True, timeout=scaled(30)) if os.geteuid() == 0 else None
        require(done is not None and done.returncode == 0, "mounting a tmpfs needs root and CAP_SYS_ADMIN")
        mounted.append(path)
        return path

    mounted: list[Path] = []
    yield mount
    for path in mounted:
        subprocess.run(["umount", str(path)], check=True, timeout=scaled(30))


def test_a_full_disk_on_either_side_stops_with_its_exit_code(cli, catalog, customer, lease, box, tmp_path, tiny_disk):  # noqa: F811
    login(cli, customer)
    (tmp_path / "big.bin").write_bytes(os.urandom(3 * MiB))
    full = tiny_disk(box.files / "full")
    code, out, err = cp(cli, box, str(tmp_path / "big.bin"), f"{lease.pk}:{full}/", "--json")
    assert code == errors.NO_SPACE and json.loads(out)["error"] == "no_space"
    assert f"No space left on lease #{lease.pk}'s disk" in err and "run the same command again" in err
    (box.files / "big.bin").write_bytes(os.urandom(3 * MiB))
    here = tiny_disk(tmp_path / "here")
    code, _out, err = cp(cli, box, f"{lease.pk}:{box.files}/big.bin", f"{here}/")
    assert code == errors.NO_SPACE and "No space left on this computer's disk" in err
