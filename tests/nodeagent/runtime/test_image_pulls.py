"""Image pulls never block the loop. The private dockerd pulls from a registry
of the test's own (tests/nodeagent/registry.py, in the node's network namespace) whose
layer is the debootstrap instance image; a gate file holds a pull open for as long as the
test wants. `gpu-node-agent images pull|prune` against the same daemon."""
import subprocess
import sys
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

from ..agent_process import IMAGE_SLUG, STUB_GPUS, agent_cli, agent_env, write_config
from ..conftest import IMAGE_SCRIPT, stand_in_devices
from ..helpers import GPUS, desired

REGISTRY = Path(__file__).parent.parent / "registry.py"


class Registry:
    def __init__(self, netns, tmp_path: Path):
        build = subprocess.run([str(IMAGE_SCRIPT)], capture_output=True, text=True, check=True)
        self.gate = tmp_path / "registry.gate"
        self.process = subprocess.Popen(
            ["ip", "netns", "exec", netns.node, sys.executable, str(REGISTRY), "--layer",
             build.stdout.strip(), "--repo", "gpu/test", "--tags", "1,2,3", "--gate",
             str(self.gate)], stdout=subprocess.PIPE, text=True)
        self.port = int(self.process.stdout.readline())

    def ref(self, tag: str) -> str:
        return f"127.0.0.1:{self.port}/gpu/test:{tag}"

    def hold(self) -> None:
        self.gate.touch()

    def release(self) -> None:
        self.gate.unlink(missing_ok=True)

    def stop(self) -> None:
        self.release()
        self.process.terminate()
        self.process.wait(10)


@pytest.fixture
def registry(netns, dockerd, tmp_path):
    reg = Registry(netns, tmp_path)
    yield reg
    reg.stop()
    client = dockerd.client()
    for tag in ("1", "2", "3"):
        try:
            client.images.remove(reg.ref(tag), force=True)
        except Exception:
            pass


@pytest.fixture
def runtime_for(dockerd, tmp_path):
    made = []

    def make(images: dict) -> DockerRuntime:
        config = DockerConfig(socket=dockerd.socket, gpu_mode="devices",
                              gpu_devices=stand_in_devices(STUB_GPUS),
                              port_range=(22500, 22599), stop_timeout=2)
        runtime = DockerRuntime(config, tmp_path / "runtime", images=frozenset(images.values()))
        made.append(runtime)
        return runtime
    yield make
    for runtime in made:
        runtime.puller.wait_idle(120)
        for lease_id in runtime.lease_ids():
            runtime.ensure_absent(lease_id)


def test_a_pull_runs_beside_the_loop(registry, runtime_for, instance_image, tmp_path):
    images = {"big-image": registry.ref("1"), IMAGE_SLUG: instance_image}
    runtime = runtime_for(images)
    converger = Converger(node="n1", runtime=runtime, disks=DirectoryDisks(tmp_path / "disks"),
                          journal=Journal(tmp_path / "journal.json"),
                          outbox=Outbox(tmp_path / "outbox.json"),
                          key=NodeKey.generate(tmp_path / "key.pem"), images=images,
                          public_host="192.0.2.10")
    wanted = [desired(61, "61:running:1", image="big-image"), desired(62, "62:running:1")]
    registry.hold()                                        # the multi-GB download, stalled
    reports = {r["lease_id"]: r for r in converger.converge(wanted, GPUS)}
    assert runtime.puller.pulling(registry.ref("1"))       # the round ended mid-pull
    assert reports[61]["state"] == "absent" and reports[61]["error"]["code"] == "image_pulling"
    assert reports[62]["state"] == "running" and reports[62]["error"] is None   # not delayed
    started = time.monotonic()
    reports = {r["lease_id"]: r for r in converger.converge(wanted, GPUS)}
    assert time.monotonic() - started < 10                 # a round does not wait for it
    assert reports[61]["error"]["code"] == "image_pulling"
    assert [e["lease_id"] for e in converger.outbox.pending()] == [62]

    registry.release()
    assert runtime.puller.wait_idle(300), "the pull did not finish"
    reports = {r["lease_id"]: r for r in converger.converge(wanted, GPUS)}
    assert reports[61]["state"] == "running" and reports[61]["error"] is None
    assert sorted(e["lease_id"] for e in converger.outbox.pending()) == [61, 62]


def test_a_failed_pull_is_named_and_not_retried_at_once(registry, runtime_for, tmp_path):
    from nodeagent.interfaces import OperationFailed

    from ..helpers import spec_for

    ref = f"127.0.0.1:{registry.port}/gpu/test:no-such-tag"
    runtime = runtime_for({"x": ref})
    with pytest.raises(OperationFailed) as first:
        runtime.ensure_running(spec_for(63, ref, str(tmp_path)))
    assert first.value.code == "image_pulling"
    assert runtime.puller.wait_idle(60)
    with pytest.raises(OperationFailed) as then:
        runtime.ensure_running(spec_for(63, ref, str(tmp_path)))
    assert then.value.code == "image_not_found" and "no-such-tag" in then.value.detail
    assert runtime.status(63).state == "absent"
    with pytest.raises(OperationFailed) as again:        # the back-off: no new pull yet
        runtime.ensure_running(spec_for(63, ref, str(tmp_path)))
    assert again.value.code == "image_not_found" and not runtime.puller.pulling(ref)


def test_images_pull_and_prune_from_the_cli(registry, dockerd, instance_image, tmp_path,
                                            nvml_stub):
    env = agent_env(nvml_stub)
    config = write_config(tmp_path / "config.toml", state_dir=tmp_path / "state",
                          dockerd=dockerd, image_ref=instance_image, public_host="192.0.2.1")
    text = config.read_text().split("[images]")[0]

    def configure(images: dict) -> None:
        config.write_text(text + "[images]\n" + "".join(f'"{k}" = "{v}"\n'
                                                       for k, v in images.items()))

    configure({"a": registry.ref("2"), "b": registry.ref("3"), IMAGE_SLUG: instance_image})
    pulled = agent_cli(config, "images", "pull", env=env)
    assert pulled.returncode == 0, pulled.stderr
    assert f"a: {registry.ref('2')} pulled" in pulled.stdout
    assert f"{IMAGE_SLUG}: {instance_image} present" in pulled.stdout
    again = agent_cli(config, "images", "pull", env=env)
    assert f"a: {registry.ref('2')} present" in again.stdout

    client = dockerd.client()
    keeper = client.containers.create(registry.ref("3"), command=["true"])
    try:
        configure({"c": registry.ref("1")})                  # a and b no longer configured
        pruned = agent_cli(config, "images", "prune", env=env)
        assert pruned.returncode == 0, pruned.stderr
        assert pruned.stdout.split() == ["removed", registry.ref("2")]
        client.images.get(registry.ref("3"))                 # used by a container: kept
        client.images.get(instance_image)                    # not pulled by the agent: kept
        with pytest.raises(Exception, match="No such image|not found"):
            client.images.get(registry.ref("2"))
    finally:
        keeper.remove(force=True)

    configure({"a": f"127.0.0.1:{registry.port}/gpu/test:missing"})
    failed = agent_cli(config, "images", "pull", env=env)
    assert failed.returncode == 1 and "pulling" in failed.stderr
