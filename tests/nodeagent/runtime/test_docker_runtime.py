"""The Docker runtime against a real (private, userns-remapped) dockerd, two stand-in GPUs
(device nodes /dev/nvidia0 and /dev/nvidia1 of dockerd's private /dev) and the debootstrap
instance image. Isolation between tenants: test_isolation.py."""
import pytest

from nodeagent.config import DockerConfig
from nodeagent.directory_disks import DirectoryDisks
from nodeagent.interfaces import OperationFailed
from nodeagent.runtime.docker import DockerRuntime
from tests.deadlines import wait_for
from tests.tools import require_tool

from ..conftest import ssh_run, stand_in_devices
from ..helpers import GPU_UUIDS, spec_for

GiB = 1024 ** 3
OTHER_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOt4yjHbQhGXpxr8tQyq6x1bT3Sx4n2Yk3Xo9mVx0bcd bob"


@pytest.fixture
def runtime(dockerd, tmp_path):
    config = DockerConfig(socket=dockerd.socket, gpu_mode="devices",
                          gpu_devices=stand_in_devices(GPU_UUIDS),
                          port_range=(22100, 22199), stop_timeout=2)
    runtime = DockerRuntime(config, tmp_path / "runtime")
    yield runtime
    for lease_id in runtime.lease_ids():
        runtime.ensure_absent(lease_id)


def exec_in(runtime, lease_id, command):
    container = runtime.client.containers.get(f"lease-{lease_id}")
    result = container.exec_run(["/bin/sh", "-c", command])
    return result.exit_code, result.output.decode()


def test_instance_gets_exactly_its_gpus_limits_disk_and_keys(runtime, instance_image, tmp_path):
    disk = DirectoryDisks(tmp_path / "disks").ensure_ready(7, 10)
    status = runtime.ensure_running(spec_for(7, instance_image, disk))

    assert status.state == "running" and 22100 <= status.ssh_port <= 22199
    inspect = runtime.client.api.inspect_container("lease-7")
    host = inspect["HostConfig"]
    assert host["NanoCpus"] == 1 * 10 ** 9
    assert host["Memory"] == 1 * GiB
    assert host["ShmSize"] == 1 * GiB
    assert sorted(d["PathInContainer"] for d in host["Devices"]) == ["/dev/nvidia0",
                                                                     "/dev/nvidia1"]
    assert sorted(d["PathOnHost"] for d in host["Devices"]) == ["/dev/nvidia0", "/dev/nvidia1"]
    assert f"{disk}:/workspace:rw" in host["Binds"]
    assert host["PortBindings"]["22/tcp"][0]["HostPort"] == str(status.ssh_port)
    assert host["PidsLimit"] == 32768
    assert host["LogConfig"] == {"Type": "none", "Config": {}}    # tenant output is not kept
    assert host["RestartPolicy"]["Name"] == "no"       # only the agent starts it
    assert exec_in(runtime, 7, "cat /root/.ssh/authorized_keys") == (
        0, "ssh-ed25519 AAAAC3Nza alice\n")
    assert exec_in(runtime, 7, "stat -c %a /root/.ssh/authorized_keys")[1].strip() == "600"
    assert exec_in(runtime, 7, "ls /dev/nvidia*")[1].split() == ["/dev/nvidia0",
                                                               "/dev/nvidia1"]
    assert runtime.lease_ids() == [7]


def test_stop_keeps_files_and_resume_keeps_the_port(runtime, instance_image, tmp_path):
    disk = DirectoryDisks(tmp_path / "disks").ensure_ready(8, 10)
    first = runtime.ensure_running(spec_for(8, instance_image, disk))
    exec_in(runtime, 8, "echo weights > /workspace/model.bin && echo cfg > /root/notes")

    stopped = runtime.ensure_stopped(8)
    assert stopped.state == "stopped"
    assert runtime.client.containers.get("lease-8").status == "exited"
    assert runtime.ensure_stopped(8).state == "stopped"          # idempotent

    resumed = runtime.ensure_running(spec_for(8, instance_image, disk))
    assert resumed.state == "running" and resumed.ssh_port == first.ssh_port
    assert exec_in(runtime, 8, "cat /workspace/model.bin /root/notes")[1] == "weights\ncfg\n"


def test_changed_keys_reach_the_running_instance(runtime, instance_image, tmp_path):
    disk = DirectoryDisks(tmp_path / "disks").ensure_ready(9, 10)
    runtime.ensure_running(spec_for(9, instance_image, disk))
    container_id = runtime.client.containers.get("lease-9").id
    runtime.ensure_running(spec_for(9, instance_image, disk, keys=("ssh-ed25519 BBBB bob",)))
    assert runtime.client.containers.get("lease-9").id == container_id   # not recreated
    assert exec_in(runtime, 9, "cat /root/.ssh/authorized_keys")[1] == "ssh-ed25519 BBBB bob\n"


def test_absent_removes_the_container_and_frees_the_port(runtime, instance_image, tmp_path):
    disk = DirectoryDisks(tmp_path / "disks").ensure_ready(10, 10)
    runtime.ensure_running(spec_for(10, instance_image, disk))
    assert runtime.ensure_absent(10).state == "absent"
    assert runtime.status(10).state == "absent"
    assert runtime.lease_ids() == []
    assert runtime.ensure_absent(10).state == "absent"           # idempotent
    assert (tmp_path / "disks" / "lease-10").is_dir()           # the disk is not the runtime's


def test_missing_image_is_a_named_failure(runtime, tmp_path):
    with pytest.raises(OperationFailed) as pulling:          # the pull runs beside the loop
        runtime.ensure_running(spec_for(11, "no-such-image:1", str(tmp_path)))
    assert pulling.value.code == "image_pulling"
    assert runtime.puller.wait_idle(120)
    with pytest.raises(OperationFailed) as failure:
        runtime.ensure_running(spec_for(11, "no-such-image:1", str(tmp_path)))
    assert failure.value.code == "image_missing"
    assert "no-such-image:1" in failure.value.detail and "pulling it failed" in failure.value.detail
    assert runtime.status(11).state == "absent"


def test_unknown_gpu_is_a_named_failure(runtime, instance_image, tmp_path):
    with pytest.raises(OperationFailed) as failure:
        runtime.ensure_running(spec_for(12, instance_image, str(tmp_path),
                                        gpus=("GPU-not-on-this-node",)))
    assert failure.value.code == "gpu_missing"


def test_customer_logs_in_over_ssh_from_another_namespace(runtime, instance_image, netns,
                                                          ssh_key, tmp_path):
    require_tool("ssh", "openssh-client")
    key_path, public_key = ssh_key
    disk = DirectoryDisks(tmp_path / "disks").ensure_ready(13, 10)
    status = runtime.ensure_running(spec_for(13, instance_image, disk, keys=(public_key,)))

    login = ssh_run(netns, key_path, status.ssh_port,
                    "ls /dev/nvidia*; head -c 200000 /dev/zero | base64 >/dev/null; "
                    "echo hello > /workspace/hello; head -c 300000 /dev/urandom | base64")
    assert login.returncode == 0, login.stderr
    assert login.stdout.split()[:2] == ["/dev/nvidia0", "/dev/nvidia1"]
    assert (tmp_path / "disks" / "lease-13" / "hello").read_text() == "hello\n"
    # the session's output left through the container's network: egress is counted
    assert runtime.status(13).egress_bytes > 300000


def test_ssh_with_another_key_is_refused(runtime, instance_image, netns, ssh_key, tmp_path):
    require_tool("ssh", "openssh-client")
    key_path, _ = ssh_key
    disk = DirectoryDisks(tmp_path / "disks").ensure_ready(14, 10)
    status = runtime.ensure_running(spec_for(14, instance_image, disk,
                                             keys=(OTHER_KEY,)))
    attempts = []

    def refused_by_sshd():      # not a refused connection while sshd is still starting
        attempts.append(ssh_run(netns, key_path, status.ssh_port, "true", attempts=1))
        return "Permission denied" in attempts[-1].stderr

    wait_for(refused_by_sshd, 30, "sshd to refuse the other key", every=0.5, detail=lambda: attempts[-1].stderr)
    assert attempts[-1].returncode == 255


def test_changed_gpus_recreate_the_container_keeping_the_disk(runtime, instance_image, tmp_path):
    disk = DirectoryDisks(tmp_path / "disks").ensure_ready(16, 10)
    first = runtime.ensure_running(spec_for(16, instance_image, disk))
    exec_in(runtime, 16, "echo data > /workspace/d")
    old_id = runtime.client.containers.get("lease-16").id
    second = runtime.ensure_running(spec_for(16, instance_image, disk, gpus=GPU_UUIDS[:1]))
    assert runtime.client.containers.get("lease-16").id != old_id
    assert second.ssh_port == first.ssh_port
    assert exec_in(runtime, 16, "ls /dev/nvidia*; cat /workspace/d")[1].split() == [
        "/dev/nvidia0", "data"]


def test_after_an_upgrade_an_instance_that_cannot_open_its_gpu_is_named(runtime, instance_image, tmp_path, dockerd):
    """nodeagent/gpu_attachment.py against the real daemon: the instance opens its device
    nodes from inside; one it can no longer open (here: the stand-in node's mode taken away
    in dockerd's /dev, as a detached device cgroup refuses it) marks the lease's GPUs
    `gpu_detached` until it can again."""
    import subprocess
    from dataclasses import replace

    from nodeagent.gpu_attachment import AttachmentCheck
    from nodeagent.interfaces import GpuInfo

    disk = DirectoryDisks(tmp_path / "disks").ensure_ready(12, 10)
    runtime.ensure_running(spec_for(12, instance_image, disk, gpus=GPU_UUIDS[1:]))
    assert runtime.gpu_access(12) == {"uuids": [GPU_UUIDS[1]], "seen": 2, "unreachable": []}
    gpus = [GpuInfo(index=i, uuid=u, name="stand-in", memory_mb=1, driver="", cuda="", temperature_c=None,
                    ecc_uncorrected=0, xid_errors=(), healthy=True) for i, u in enumerate(GPU_UUIDS)]
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "agent-version").write_text("0.0.9\n")
    check = AttachmentCheck(tmp_path / "state", "0.1.0")
    nsenter = require_tool("nsenter")
    subprocess.run([nsenter, "-t", str(dockerd.pid), "-m", "chmod", "000", "/dev/nvidia1"], check=True)
    try:
        marked = check.apply(gpus, runtime)
    finally:
        subprocess.run([nsenter, "-t", str(dockerd.pid), "-m", "chmod", "666", "/dev/nvidia1"], check=True)
    assert [c.code for c in marked[1].conditions] == ["gpu_detached"] and not marked[1].healthy
    assert "/dev/nvidia1" in marked[1].conditions[0].detail and marked[0] == gpus[0]
    assert check.apply([replace(g) for g in gpus], runtime) == gpus     # reachable again: cleared
