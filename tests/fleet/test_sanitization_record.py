"""The customer downloads the signed sanitization record of their lease (JSON
with the node's public key and signatures, and a printable page) from the lease page and
the API; the timeline's "with receipt" links to it; `gpu-node-agent verify-record FILE`
checks it offline, and a changed byte or another key fails it."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from nodeagent.records import verify_record
from rental.accounts.services import api_token_create
from tests.fleet.helpers import op_of, released

from .conftest import disk_wiped, key_destroyed, node_of, ready

pytestmark = pytest.mark.django_db
AGENT = Path(sys.executable).parent / "gpu-node-agent"


def _cli(path: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(AGENT), "verify-record", str(path), *extra], capture_output=True, text=True,
                          timeout=60)


def test_the_customer_downloads_a_record_anyone_can_check(wiped, customer, tmp_path):
    lease, node = wiped
    client = Client()
    client.force_login(customer)
    page = client.get(reverse("lease_detail", args=[lease.pk])).content.decode()
    json_url = reverse("sanitization_record", args=[lease.pk])
    printable_url = reverse("sanitization_record_page", args=[lease.pk])
    assert f'href="{json_url}"' in page and f'href="{printable_url}"' in page
    assert 'class="tl-receipt"' in page                    # the timeline's "with receipt"

    response = client.get(json_url)
    assert response.status_code == 200 and response["Content-Type"] == "application/json"
    assert f"sanitization-record-lease-{lease.pk}.json" in response["Content-Disposition"]
    record = json.loads(response.content)
    assert [p["kind"] for p in record["proofs"]] == ["key_destroyed", "disk_wiped"]
    assert {p["public_key"] for p in record["proofs"]} == {node.public_key}
    assert all(r.ok for r in verify_record(record, node_key=node.public_key))

    path = tmp_path / "record.json"
    path.write_bytes(response.content)
    checked = _cli(path, "--node-key", node.public_key)
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.count("OK ") == 2 and "discard+overwrite" in checked.stdout

    # One changed byte in what the node signed (the method), or another node's key: refused.
    forged = json.loads(response.content)
    forged["proofs"][1]["signed"] = forged["proofs"][1]["signed"].replace("discard+overwrite", "sanitize-crypto")
    path.write_text(json.dumps(forged))
    assert _cli(path).returncode == 1 and "BAD disk_wiped" in _cli(path).stdout
    path.write_bytes(response.content)
    other_key = record["proofs"][0]["public_key"][:-4] + "AAA="
    assert _cli(path, "--node-key", other_key).returncode == 1

    printable = client.get(printable_url).content.decode()
    assert "TEST NVMe" in printable and "discard+overwrite" in printable and node.public_key in printable
    assert record["proofs"][1]["signature"] in printable


def test_the_api_serves_the_same_record_to_its_owner_only(wiped, customer, other_customer):
    lease, node = wiped
    token = api_token_create(customer=customer, name="t")[1]
    url = reverse("api_lease_sanitization_record", args=[lease.pk])
    response = Client().get(url, HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 200
    assert all(r.ok for r in verify_record(json.loads(response.content), node_key=node.public_key))
    other = api_token_create(customer=other_customer, name="o")[1]
    assert Client().get(url, HTTP_AUTHORIZATION=f"Bearer {other}").status_code == 404
    assert Client().get(url).status_code == 401
    browser = Client()
    browser.force_login(other_customer)
    assert browser.get(reverse("sanitization_record", args=[lease.pk])).status_code == 404


def test_no_record_before_a_proven_key_destruction(paid_lease, enrol, customer):
    lease = paid_lease()
    enrol(node_of(lease))
    client = Client()
    client.force_login(customer)
    assert client.get(reverse("sanitization_record", args=[lease.pk])).status_code == 404
    assert 'id="sanitization-record"' not in client.get(reverse("lease_detail", args=[lease.pk])).content.decode()
    token = api_token_create(customer=customer, name="t")[1]
    response = Client().get(reverse("api_lease_sanitization_record", args=[lease.pk]),
                            HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 404 and response.json()["error"] == "not_yet"


def _record_file(client, lease, tmp_path) -> Path:
    path = tmp_path / f"record-{lease.pk}.json"
    path.write_bytes(client.get(reverse("sanitization_record", args=[lease.pk])).content)
    return path


def test_without_node_key_the_cli_warns_that_only_the_record_s_own_key_was_checked(wiped, customer, tmp_path):
    lease, node = wiped
    client = Client()
    client.force_login(customer)
    path = _record_file(client, lease, tmp_path)
    bare = _cli(path)
    assert bare.returncode == 0 and bare.stdout.count("OK ") == 2
    assert "WARNING: no --node-key given" in bare.stderr and "not which server signed it" in bare.stderr
    keyed = _cli(path, "--node-key", node.public_key)
    assert keyed.returncode == 0 and "WARNING" not in keyed.stderr


def test_a_record_whose_disk_is_not_proven_wiped_says_missing_and_exits_6(paid_lease, enrol, customer, tmp_path):
    """Key destroyed, wipe not proven yet: every proof there checks out, but the record does
    not prove the disk wiped — a distinct exit status (6), never a plain OK."""
    lease = paid_lease()
    node = enrol(node_of(lease))
    lease = released(lease, node, timezone.now())
    assert node.report(evidence=[key_destroyed(node, lease, op_id=op_of(node, lease))]).json()["accepted"]
    client = Client()
    client.force_login(customer)
    checked = _cli(_record_file(client, lease, tmp_path), "--node-key", node.public_key)
    assert checked.returncode == 6, (checked.stdout, checked.stderr)
    assert "OK  key_destroyed" in checked.stdout
    [missing] = [line for line in checked.stdout.splitlines() if line.startswith("MISSING")]
    assert missing.startswith("MISSING disk_wiped:") and "no proof that the disk was wiped" in missing
    # A bad proof outranks a missing one: exit 1.
    forged = json.loads(_record_file(client, lease, tmp_path).read_text())
    forged["proofs"][0]["signed"] = forged["proofs"][0]["signed"].replace('"keyslots_after":0', '"keyslots_after":1')
    (tmp_path / "forged.json").write_text(json.dumps(forged))
    assert _cli(tmp_path / "forged.json", "--node-key", node.public_key).returncode == 1


def test_a_moved_lease_s_record_is_checked_with_each_server_s_key(paid_lease, enrol, customer, tmp_path):
    """The copy a move left is proven by the old server, the lease's own disk by the new one:
    `--node-key` once per server; a proof signed by a key not given fails."""
    from rental.failover import lease_migrate

    lease = paid_lease()
    source = enrol(node_of(lease))
    source.report(evidence=[ready(source, lease)])
    lease_migrate(lease_id=lease.pk, from_node=source.node, now=timezone.now(), reason="test")
    target = enrol(node_of(lease))
    for _ in range(2):      # the copy's key, then (asked once the key is proven) its wipe
        [item] = source.desired().json()["instances"]
        kind = key_destroyed if item["disk"] == "destroy_key" else disk_wiped
        assert source.report(evidence=[kind(source, lease, op_id=item["op_id"])]).json()["accepted"]
    lease = released(lease, target, timezone.now())
    assert target.report(evidence=[key_destroyed(target, lease, op_id=op_of(target, lease))]).json()["accepted"]
    assert target.report(evidence=[disk_wiped(target, lease, op_id=op_of(target, lease))]).json()["accepted"]
    client = Client()
    client.force_login(customer)
    path = _record_file(client, lease, tmp_path)
    both = _cli(path, "--node-key", target.public_key, "--node-key", source.public_key)
    assert both.returncode == 0 and both.stdout.count("OK ") == 4, both.stdout
    assert both.stdout.count("(the copy a move left there)") == 2
    one = _cli(path, "--node-key", target.public_key)
    assert one.returncode == 1 and one.stdout.count("signed by another key than --node-key") == 2
