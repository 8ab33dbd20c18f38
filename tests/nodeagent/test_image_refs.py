"""The pure parts of customer images (no dockerd): references, the mapping of dockerd's
errors to the contract's codes, progress summed over layers, the back-off, the desired
item's new fields, and what enters the spec hash. The real pulls: runtime/test_customer_images.py."""
import time

import pytest

from nodeagent.config import ConfigError, parse_config
from nodeagent.converge import Converger
from nodeagent.image_refs import normalise_reference
from nodeagent.interfaces import InstanceSpec, InstanceStatus, OperationFailed
from nodeagent.item_fields import environment as _environment
from nodeagent.item_fields import registry_auth as _registry_auth
from nodeagent.item_fields import start_command as _start_command
from nodeagent.runtime.container_options import _spec_hash, _ssh_environment
from nodeagent.runtime.images import ImagePuller, Progress, classify


@pytest.mark.parametrize("ref, expected", [
    ("ubuntu", "ubuntu:latest"),
    ("ubuntu:22.04", "ubuntu:22.04"),
    ("pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime", "pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime"),
    ("registry.example:5000/team/name", "registry.example:5000/team/name:latest"),
    ("localhost:5000/a/b:c", "localhost:5000/a/b:c"),
    ("ghcr.io/o/r@sha256:" + "a" * 64, "ghcr.io/o/r@sha256:" + "a" * 64),
])
def test_valid_references_keep_or_gain_a_tag(ref, expected):
    assert normalise_reference(ref) == expected


@pytest.mark.parametrize("ref", ["", "Ubuntu:22.04", "a b", "name:", "-x/y", "x//y",
                                 "reg/name@sha256:abc", "name:" + "t" * 200, None, 42,
                                 "ubuntu; rm -rf /", "ubuntu:ta\u0308g"])
def test_malformed_references_are_image_not_found_with_a_reason(ref):
    with pytest.raises(OperationFailed) as failed:
        normalise_reference(ref)
    assert failed.value.code == "image_not_found" and "reference" in failed.value.detail


@pytest.mark.parametrize("message, with_auth, code", [
    ("manifest for 127.0.0.1:5000/a:b not found: manifest unknown: manifest unknown", False, "image_not_found"),
    ("Head \"http://r/v2/a/manifests/b\": no basic auth credentials", False, "registry_auth_failed"),
    ("unauthorized: authentication required", True, "registry_auth_failed"),
    ("pull access denied for acme/private, repository does not exist or may require "
     "'docker login': denied: requested access to the resource is denied", False, "image_not_found"),
    ("pull access denied for acme/private, repository does not exist or may require "
     "'docker login': denied: requested access to the resource is denied", True, "registry_auth_failed"),
    ("Get \"https://r.example/v2/\": dial tcp: lookup r.example: no such host", False, "image_not_found"),
    ("received unexpected HTTP status: 500 Internal Server Error", False, "image_missing"),
])
def test_dockerd_errors_map_to_the_contract_codes(message, with_auth, code):
    got, human = classify(message, with_auth=with_auth)
    assert got == code and human and "docker login" not in human


def test_progress_sums_the_layers_bytes():
    progress = Progress()
    events = [
        {"status": "Pulling from team/x", "id": "1"},                         # not a layer
        {"status": "Pulling fs layer", "id": "aaa"}, {"status": "Pulling fs layer", "id": "bbb"},
        {"status": "Already exists", "id": "ccc"},                            # not downloaded
        {"status": "Downloading", "id": "aaa", "progressDetail": {"current": 100, "total": 1000}},
        {"status": "Downloading", "id": "bbb", "progressDetail": {"current": 50, "total": 500}},
        {"status": "Downloading", "id": "aaa", "progressDetail": {"current": 400, "total": 1000}},
    ]
    for event in events:
        progress.update(event)
    assert progress.report() == {"done_bytes": 450, "total_bytes": 1500}
    progress.update({"status": "Download complete", "id": "bbb"})
    progress.update({"status": "Extracting", "id": "bbb", "progressDetail": {"current": 1, "total": 9}})
    assert progress.report() == {"done_bytes": 900, "total_bytes": 1500}
    progress.update({"status": "Pull complete", "id": "aaa"})
    assert progress.report() == {"done_bytes": 1500, "total_bytes": 1500}


def test_a_failed_pull_backs_off_doubling_and_new_credentials_try_at_once(tmp_path):
    puller = ImagePuller("unix:///nowhere.sock", tmp_path / "images.json", retry_seconds=10,
                         retry_max_seconds=25)
    assert [puller.backoff(n) for n in (1, 2, 3, 4)] == [10, 20, 25, 25]
    auth = {"server": "r", "username": "u", "password": "p"}
    puller._note_failure(("r/x:1", _key(auth)), "registry_auth_failed", "refused")
    assert puller.failure("r/x:1", auth) == ("registry_auth_failed", "refused")
    assert puller.failure("r/x:1", {**auth, "password": "new"}) is None     # new credentials
    assert puller.failure("r/x:1") is None                                  # none at all
    when, count, code, message = puller._failed[("r/x:1", _key(auth))]
    puller._failed[("r/x:1", _key(auth))] = (when - 11, count, code, message)
    assert puller.failure("r/x:1", auth) is None                            # the wait is over
    puller._note_failure(("r/x:1", _key(auth)), "registry_auth_failed", "refused")
    puller._failed[("r/x:1", _key(auth))] = (time.monotonic() - 11, 2, code, message)
    assert puller.failure("r/x:1", auth) is not None                        # 20 s the second time


def _key(auth):
    from nodeagent.runtime.images import auth_key
    return auth_key(auth)


def test_the_item_fields_are_checked_and_name_no_value():
    assert _environment({"B": "2", "A": "x y"}) == (("A", "x y"), ("B", "2"))
    assert _environment(None) == () and _start_command(None) == ""
    for bad in ({"1X": "v"}, {"A-B": "v"}, {"A": 3}, ["A=1"]):
        with pytest.raises(OperationFailed) as failed:
            _environment(bad)
        assert failed.value.code == "bad_desired_state"
    with pytest.raises(OperationFailed) as failed:
        _environment({"TOKEN": "sec\0ret"})
    assert "TOKEN" in failed.value.detail and "sec" not in failed.value.detail
    with pytest.raises(OperationFailed):
        _start_command("x" * 5000)
    assert _registry_auth({"server": "r", "username": "u", "password": "p", "extra": 1}) == {
        "server": "r", "username": "u", "password": "p"}
    with pytest.raises(OperationFailed):
        _registry_auth({"username": 5})


def spec(**fields) -> InstanceSpec:
    base = dict(lease_id=1, image="r/x:1", gpu_uuids=("GPU-1",), ssh_authorized_keys=(),
                cpus=1, memory_gb=1, shm_gb=0, disk_path="/d")
    return InstanceSpec(**{**base, **fields})


def test_env_start_command_and_reference_change_the_container_but_secrets_stay_out():
    plain = _spec_hash(spec())
    assert _spec_hash(spec(customer_image=True, registry_auth={"password": "p"})) == plain
    assert _spec_hash(spec(image="r/x:2")) != plain
    assert _spec_hash(spec(start_command="jupyter lab")) != plain
    with_env = _spec_hash(spec(env=(("TOKEN", "a"),)))
    assert with_env != plain and with_env != _spec_hash(spec(env=(("TOKEN", "b"),)))
    shown = repr(spec(env=(("TOKEN", "hunter2"),), registry_auth={"password": "pw-9"}))
    assert "hunter2" not in shown and "pw-9" not in shown
    assert _ssh_environment((("A", "1 2"), ("B", "two\nlines"))) == b"A=1 2\n"


class FakeRuntime:
    """A runtime whose image is always being pulled, with some bytes done."""

    def __init__(self):
        self.asked = []

    def status(self, lease_id):
        return InstanceStatus(lease_id=lease_id, state="absent")

    def ensure_running(self, spec):
        self.asked.append(spec)
        raise OperationFailed("image_pulling", f"image {spec.image!r} is being pulled")

    def pull_progress(self, ref):
        return {"done_bytes": 5, "total_bytes": 9} if ref == "r.example/team/x:latest" else None

    def lease_ids(self):
        return []

    def unpause_all(self, *, except_leases):
        return []


class FakeDisks:
    def ensure_ready(self, lease_id, size_gb):
        return "/d"

    def is_ready(self, lease_id):
        return True


def test_the_report_carries_the_pull_progress_and_the_spec_the_item(tmp_path):
    from nodeagent.journal import Journal
    from nodeagent.outbox import Outbox
    from nodeagent.signing import NodeKey

    from .helpers import GPUS, desired

    runtime = FakeRuntime()
    converger = Converger(node="n1", runtime=runtime, disks=FakeDisks(),
                          journal=Journal(tmp_path / "journal.json"),
                          outbox=Outbox(tmp_path / "outbox.json"),
                          key=NodeKey.generate(tmp_path / "key.pem"), images={},
                          public_host="192.0.2.10")
    item = {**desired(5, "5:running:1", image="custom"), "image_ref": "r.example/team/x",
            "registry_auth": {"server": "r.example", "username": "u", "password": "pw-7"},
            "env": {"HF_TOKEN": "hf-secret"}, "start_command": "sleep 1", "image_max_bytes": 1000}
    [report] = converger.converge([item], GPUS)
    assert report["state"] == "absent" and report["error"]["code"] == "image_pulling"
    assert report["pull"] == {"done_bytes": 5, "total_bytes": 9}
    [asked] = runtime.asked
    assert (asked.image, asked.customer_image, asked.image_max_bytes) == ("r.example/team/x:latest", True, 1000)
    assert asked.registry_auth["password"] == "pw-7" and asked.env == (("HF_TOKEN", "hf-secret"),)
    assert asked.start_command == "sleep 1"
    stored = (tmp_path / "journal.json").read_text()
    assert "pw-7" not in stored and "hf-secret" not in stored

    [failed] = converger.converge([{**item, "image_ref": "No Such/Ref"}], GPUS)
    assert failed["state"] == "failed" and failed["error"]["code"] == "image_not_found"
    assert "pull" not in failed
    # an operator template (no image_ref): [images], no credentials even if sent
    converger.images = {"tpl": "local/tpl:1"}
    converger.converge([{**desired(6, "6:running:1", image="tpl"), "registry_auth": item["registry_auth"]}], GPUS)
    assert (runtime.asked[-1].image, runtime.asked[-1].customer_image,
            runtime.asked[-1].registry_auth) == ("local/tpl:1", False, None)


def test_the_pull_settings_are_positive_numbers():
    config = parse_config({"docker": {"pull_retry_seconds": 30, "ssh_bundle_dir": "/srv/ssh"}})
    assert config.docker.pull_retry_seconds == 30 and config.docker.ssh_bundle_dir == "/srv/ssh"
    for bad in (0, -1, True, "5"):
        with pytest.raises(ConfigError, match="pull_retry_seconds"):
            parse_config({"docker": {"pull_retry_seconds": bad}})
