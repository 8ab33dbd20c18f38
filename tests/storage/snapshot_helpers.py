"""The snapshot tests' storefront side: a node loop serving the storefront, a command run in a
lease's container, an order with a snapshot and its lease page."""
import json
import time

from django.urls import reverse
from django.utils import timezone

from nodeagent.config import DockerConfig
from nodeagent.converge import Converger
from nodeagent.directory_disks import DirectoryDisks
from nodeagent.interfaces import GpuInfo
from nodeagent.journal import Journal, utc_now
from nodeagent.outbox import Outbox
from nodeagent.runtime.docker import DockerRuntime
from nodeagent.signing import NodeKey
from tests import deadlines
from tests.nodeagent.agent_process import stub_uuid
from tests.nodeagent.conftest import stand_in_devices

IMAGE = "pytorch-2.5-cuda-12.4"


SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIC0FpbGmAodSM8zcXsymaWbQuYjSezzZsRDuhJOvzk3F alice"


class NodeLoop:
    """One node's agent loop, in-process: desired state in, converge, signed report out."""

    def __init__(self, client, node, root, dockerd, image_ref, ports):
        from fleet.services import enrolment_code_create, node_enrol

        self.client, self.node, self.seq = client, node, 0
        self.key = NodeKey.generate(root / "key.pem")
        code = enrolment_code_create(node=node, actor=None, now=timezone.now())
        self.credential = node_enrol(code=code, public_key=self.key.public_key_b64(), agent_version="0.1.0",
                                     hostname=node.name, now=timezone.now()).credential
        self.gpus = [GpuInfo(index=i, uuid=stub_uuid(i), name="stand-in", memory_mb=1, driver="", cuda="",
                             temperature_c=None, ecc_uncorrected=0, xid_errors=(), healthy=True)
                     for i in range(node.gpu_count)]
        config = DockerConfig(socket=dockerd.socket, gpu_mode="devices", port_range=ports, stop_timeout=2,
                              gpu_devices=stand_in_devices([g.uuid for g in self.gpus]))
        self.outbox = Outbox(root / "outbox.json")
        self.runtime = DockerRuntime(config, root / "runtime")
        self.converger = Converger(node=node.name, runtime=self.runtime, disks=DirectoryDisks(root / "disks"),
                                   journal=Journal(root / "journal.json"), outbox=self.outbox, key=self.key,
                                   images={IMAGE: image_ref}, public_host="192.0.2.7")

    def once(self) -> dict:
        auth = {"HTTP_AUTHORIZATION": f"Node {self.credential}"}
        desired = self.client.get("/agent/v1/desired", **auth)
        assert desired.status_code == 200, desired.content
        instances = self.converger.converge(desired.json()["instances"], self.gpus, None)
        self.seq += 1
        evidence = self.outbox.pending()
        body = json.dumps({"seq": self.seq, "sent_at": utc_now(), "agent_version": "0.1.0",
                           "public_host": "192.0.2.7", "gpus": [], "gpu_library": "nvml",
                           "instances": instances, "evidence": evidence}).encode()
        answer = self.client.post("/agent/v1/report", body, content_type="application/json",
                                  HTTP_X_NODE_SIGNATURE=self.key.sign(body), **auth)
        assert answer.status_code == 200, answer.content
        self.outbox.settle(evidence, answer.json())
        return {"desired": desired.json(), "instances": instances, "answer": answer.json()}

    def until(self, condition, *, timeout=240, what="condition"):
        deadline, last = deadlines.Deadline(timeout), None
        while not deadline.expired():
            last = self.once()
            if condition():
                return last
            time.sleep(0.5)
        raise AssertionError(f"timed out after {deadline.waited:.0f} s waiting for {what}: {last}")

    def remove_all(self):
        for lease_id in self.runtime.lease_ids():
            self.runtime.ensure_absent(lease_id)


def _exec(dockerd, lease_id, command) -> str:
    done = dockerd.client().containers.get(f"lease-{lease_id}").exec_run(["sh", "-c", command])
    assert done.exit_code == 0, done.output
    return done.output.decode()


def _order(customer):
    from billing.services import checkout_place_order
    from inventory.models import Offer, Site, SlotAllocation
    from rental.models import Image

    lease, _invoice = checkout_place_order(
        customer=customer, offer=Offer.objects.get(slug="rtx-3090"), site=Site.objects.get(code="DFW-1"),
        term="week", image=Image.objects.get(slug=IMAGE), ssh_public_key=SSH_KEY, pay_from_balance=True,
        now=timezone.now())
    return lease, SlotAllocation.objects.filter(lease_id=lease.pk, released_at__isnull=True).first().slot.node


def _active(lease) -> bool:
    from rental.models import Lease, LeaseState

    return Lease.objects.get(pk=lease.pk).state == LeaseState.ACTIVE


def _snapshot_button(client, customer, lease):
    """The lease page's "Snapshot this disk" (a plain form POST)."""
    from rental.models import Snapshot

    client.force_login(customer)
    response = client.post(reverse("storage_mine:snapshot_create"), {"lease": lease.pk, "size_tb": 1})
    assert response.status_code == 302
    client.logout()
    return Snapshot.objects.filter(source_lease=lease).latest("pk")


def _lease_page(client, customer, lease) -> str:
    client.force_login(customer)
    page = client.get(reverse("lease_detail", args=[lease.pk])).content.decode()
    client.logout()
    return page
