"""A customer's own image (desired item `image_ref`, docs/adr/0014), against the private
dockerd and registries of the test's own (tests/nodeagent/registry.py, in the node's
network namespace, no outside network):

- `public`: the debootstrap image (it has sshd) at gpu/public:1;
- `private`: a static busybox image (no sshd, no libc at all) behind Basic credentials:
  reached over SSH through the node's sshd bundle (nodeagent/runtime/ssh_bundle.py);
- `shellless`: an image of one file, no /bin/sh.
"""
import io
import json
import shutil
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

from nodeagent.config import DockerConfig
from nodeagent.converge import Converger
from nodeagent.directory_disks import DirectoryDisks
from nodeagent.journal import Journal
from nodeagent.outbox import Outbox
from nodeagent.runtime.docker import DockerRuntime
from nodeagent.signing import NodeKey
from tests.deadlines import scaled

from ..agent_process import STUB_GPUS
from ..conftest import IMAGE_SCRIPT, ssh_run, stand_in_devices
from ..helpers import GPUS, desired
from ..registry_images import Registry, busybox_layer, shellless_layer

PRIVATE_AUTH = {"server": "", "username": "alice", "password": "s3cret-pw"}
MiB = 1024 ** 2


@pytest.fixture(scope="module")
def public_layer(node_tmp_root):
    """The debootstrap image's tarball plus one file: a layer digest of its own. Once
    dockerd has downloaded a blob it knows which local layer it is, and would no longer
    download test_image_pulls.py's (the plain tarball's) at all."""
    debootstrap = Path(subprocess.run([str(IMAGE_SCRIPT)], capture_output=True, text=True,
                                      check=True).stdout.strip())
    layer = node_tmp_root / "customer-public-layer.tar"
    if not layer.exists():
        shutil.copyfile(debootstrap, layer)
        with tarfile.open(layer, "a") as tar:
            data = b"a customer's public image\n"
            info = tarfile.TarInfo("etc/customer-image")
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return layer


@pytest.fixture
def registries(netns, dockerd, tmp_path, public_layer):
    made = {}
    made["public"] = Registry(netns, public_layer, tmp_path / "public.gate", "gpu/public",
                              hold_after=16 * MiB)
    made["private"] = Registry(netns, busybox_layer(tmp_path / "busybox.tar"),
                               tmp_path / "private.gate", "team/tools",
                               auth=f"{PRIVATE_AUTH['username']}:{PRIVATE_AUTH['password']}")
    made["shellless"] = Registry(netns, shellless_layer(tmp_path / "hello.tar"),
                                 tmp_path / "shellless.gate", "gpu/hello")
    yield made
    client = dockerd.client()
    for registry in made.values():
        registry.stop()
        try:
            client.images.remove(registry.ref(), force=True)
        except Exception:
            pass


@pytest.fixture
def node(dockerd, tmp_path):
    config = DockerConfig(socket=dockerd.socket, gpu_mode="devices",
                          gpu_devices=stand_in_devices(STUB_GPUS),
                          port_range=(22600, 22699), stop_timeout=2,
                          pull_retry_seconds=60, pull_retry_max_seconds=120,
                          ssh_bundle_dir=str(tmp_path / "ssh-bundle"))
    runtime = DockerRuntime(config, tmp_path / "runtime")
    converger = Converger(node="n1", runtime=runtime, disks=DirectoryDisks(tmp_path / "disks"),
                          journal=Journal(tmp_path / "journal.json"),
                          outbox=Outbox(tmp_path / "outbox.json"),
                          key=NodeKey.generate(tmp_path / "key.pem"), images={},
                          public_host="192.0.2.10")
    yield converger
    runtime.puller.wait_idle(scaled(120))
    for lease_id in runtime.lease_ids():
        runtime.ensure_absent(lease_id)


def item(lease_id, ref, ssh_key=None, **fields):
    wanted = desired(lease_id, f"{lease_id}:running:1", image="custom", gpus=(0,))
    wanted["image_ref"] = ref
    if ssh_key is not None:
        wanted["ssh_authorized_keys"] = [ssh_key]
    wanted.update(fields)
    return wanted


def converge_until(converger, wanted, done, timeout=120):
    """Rounds of the converge loop until `done(report)`; the reports seen on the way."""
    deadline = time.monotonic() + scaled(timeout)
    seen = []
    while time.monotonic() < deadline:
        reports = {r["lease_id"]: r for r in converger.converge([wanted], GPUS)}
        report = reports[wanted["lease_id"]]
        seen.append(report)
        if done(report):
            return seen
        converger.runtime.puller.wait_idle(0.5)
    raise AssertionError(f"not done within {timeout}s; last reports: {seen[-3:]}")


def test_a_public_image_by_reference_runs_with_its_env_and_start_command(
        registries, node, netns, ssh_key):
    key, public_key = ssh_key
    public = registries["public"]
    public.gate.touch()                 # the layer stalls after 16 MiB: the pull is seen
    wanted = item(71, public.ref(), public_key, env={"GREETING": "hello there", "TOKEN": "t0k"},
                  start_command="echo \"started in $(pwd) with $GREETING\" > /workspace/started; "
                                "exec sleep 1000")
    seen = converge_until(node, wanted, lambda r: (r.get("pull") or {}).get("done_bytes", 0) > 0)
    report = seen[-1]
    assert report["state"] == "absent" and report["error"]["code"] == "image_pulling"
    assert 0 < report["pull"]["done_bytes"] < report["pull"]["total_bytes"]
    public.gate.unlink()
    report = converge_until(node, wanted, lambda r: r["state"] == "running")[-1]
    assert report["error"] is None and "pull" not in report

    result = ssh_run(netns, key, report["ssh_port"],
                     "cat /workspace/started; echo \"$TOKEN/$GREETING\"; cat /proc/[0-9]*/cmdline | tr '\\0' ' ' | grep -o 'sleep 1[0]00' | wc -l")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:3] == ["started in /workspace with hello there",
                                             "t0k/hello there", "1"]
    # the values are not in dockerd's copy of the container's configuration (node's disk)
    container = node.runtime.client.containers.get("lease-71")
    assert "t0k" not in json.dumps(container.attrs)

    # a changed start command is a new container; the disk (and its files) stay
    wanted["start_command"] = "echo second > /workspace/second; exec sleep 1000"
    wanted["op_id"] = "71:running:2"
    report = converge_until(node, wanted, lambda r: r["state"] == "running")[-1]
    result = ssh_run(netns, key, report["ssh_port"], "cat /workspace/started /workspace/second")
    assert result.stdout.split("\n")[:2] == ["started in /workspace with hello there", "second"]


def test_a_private_image_without_sshd_is_reached_through_the_node_sshd(
        registries, node, netns, ssh_key, tmp_path):
    key, public_key = ssh_key
    private = registries["private"]
    wanted = item(72, private.ref(), public_key, registry_auth={
        **PRIVATE_AUTH, "server": f"127.0.0.1:{private.port}"},
        env={"MODEL": "tiny"}, start_command="echo $MODEL > /workspace/model; exit 3")
    report = converge_until(node, wanted, lambda r: r["state"] != "absent")[-1]
    assert report["state"] == "running" and report["error"] is None, report
    result = ssh_run(netns, key, report["ssh_port"],
                     "cat /workspace/model; ls /usr/sbin/sshd 2>&1; uname -s")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.split("\n")
    assert lines[0] == "tiny" and "No such file" in lines[1] and lines[2] == "Linux"
    # the start command exited (3): sshd, PID 1, stayed up and reaped it
    again = ssh_run(netns, key, report["ssh_port"], "ps -o stat,args | awk '$1 ~ /^Z/'; "
                    "tr '\\0' ' ' < /proc/1/cmdline")
    assert again.returncode == 0, again.stderr
    [pid_1] = again.stdout.splitlines()          # no zombie line before it
    assert pid_1.startswith("/.gpu-node-ssh/lib/ld.so"), pid_1   # the bundle's sshd
    # SFTP (what scp uses) through the bundle's sftp-server too
    upload = tmp_path / "upload.txt"
    upload.write_text("over sftp\n")
    batch = tmp_path / "sftp.batch"
    batch.write_text(f"put {upload} /workspace/upload.txt\n")
    sftp = subprocess.run(netns.in_client(
        "sftp", "-i", str(key), "-P", str(report["ssh_port"]), "-b", str(batch),
        "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
        "-o", "LogLevel=ERROR", f"root@{netns.node_ip}"), capture_output=True, text=True, timeout=60)
    assert sftp.returncode == 0, sftp.stderr
    assert ssh_run(netns, key, report["ssh_port"], "cat /workspace/upload.txt").stdout == "over sftp\n"


def test_a_private_image_with_wrong_credentials_is_refused(registries, node, caplog, tmp_path):
    private = registries["private"]
    wanted = item(73, private.ref(), registry_auth={
        "server": f"127.0.0.1:{private.port}", "username": "alice", "password": "wrong-pw"})
    report = converge_until(node, wanted, lambda r: r["state"] == "failed")[-1]
    assert report["error"]["code"] == "registry_auth_failed", report
    assert "refused" in report["error"]["detail"]
    without = item(74, private.ref())
    report = converge_until(node, without, lambda r: r["state"] == "failed")[-1]
    assert report["error"]["code"] == "registry_auth_failed", report
    assert "requires credentials" in report["error"]["detail"]
    assert "wrong-pw" not in caplog.text and "wrong-pw" not in str(report)
    written = [p for p in tmp_path.rglob("*") if p.is_file() and p.stat().st_size < 10 ** 6]
    assert written and not [p for p in written if b"wrong-pw" in p.read_bytes()]


def test_the_image_of_one_lease_is_not_given_to_another_without_its_credentials(
        registries, node):
    private = registries["private"]
    good = item(75, private.ref(), registry_auth={**PRIVATE_AUTH, "server": f"127.0.0.1:{private.port}"})
    converge_until(node, good, lambda r: r["state"] == "running")
    other = item(76, private.ref())      # the image is on the node now; no credentials
    report = converge_until(node, other, lambda r: r["state"] == "failed")[-1]
    assert report["error"]["code"] == "registry_auth_failed"


def test_missing_malformed_too_large_and_shellless_images_are_named(registries, node, dockerd):
    public = registries["public"]
    cases = {
        77: (public.ref("no-such-tag"), {}, "image_not_found"),
        78: ("Not A/valid reference", {}, "image_not_found"),
        79: (public.ref(), {"image_max_bytes": 8 * MiB}, "image_too_large"),
        80: (registries["shellless"].ref(), {}, "image_no_shell"),
    }
    public.gate.touch()     # the layer stalls after 16 MiB: the limit must end the pull itself
    for lease_id, (ref, fields, code) in cases.items():
        report = converge_until(node, item(lease_id, ref, **fields),
                                lambda r: r["state"] == "failed")[-1]
        assert report["error"]["code"] == code, (lease_id, report)
        assert report["error"]["detail"]
    client = dockerd.client()
    for ref in (public.ref(), registries["shellless"].ref()):   # nothing kept of them
        with pytest.raises(Exception, match="No such image|not found"):
            client.images.get(ref)
    # a failed pull is not tried again every round, but after the back-off (60 s here)
    for _ in range(3):
        report = node.converge([item(77, public.ref("no-such-tag"))], GPUS)[0]
        assert report["error"]["code"] == "image_not_found"
        assert not node.runtime.puller.pulling(public.ref("no-such-tag"))
