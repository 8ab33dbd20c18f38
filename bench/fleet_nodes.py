"""The fleet bench's simulated nodes (bench/fleet.py, bench/fleet_report_cpu.py, bench/watch.py):
N nodes enrolled straight into the database (real Ed25519 keys, hashed credentials, 8 GPU
slots, two running leases each), the report each sends as the agent does, and the timers a
shorter poll compresses to stand for a larger fleet. Imported with bench/ on sys.path (the
name `fleet` is the Django app's)."""
import base64
import json
import os
import random
import time
from datetime import timedelta

LEASES_PER_NODE = 2   # each of the demo's largest offer that fits twice on an 8-GPU node
FLEET_POLL = 15.0     # the poll the issue's fleet runs at (NODE_POLL_SECONDS' default)
#: The settings counted in seconds that decide how often a poll costs more than a steady one:
#: the heartbeat write, a worker's credential lookup, a time-flushed egress counter, a
#: desired state recomputed.
#: The agent samples once a minute and sends five minutes at a time (telemetry_send_minutes):
#: at the fleet's 15 s poll one report in twenty carries 5 minutes of its 8 cards.
TELEMETRY_MINUTES = 5
TELEMETRY_EVERY = max(1, round(60 * TELEMETRY_MINUTES / FLEET_POLL))
TIMERS = ("NODE_SEEN_WRITE_SECONDS", "NODE_CREDENTIAL_CACHE_SECONDS", "NODE_EGRESS_FLUSH_SECONDS",
          "NODE_DESIRED_REVALIDATE_SECONDS")


def compressed_timers(poll: float) -> dict[str, int]:
    """A shorter poll stands for a larger fleet at the same request rate (1,000 nodes at 1.5 s
    for 10,000 at 15 s) only if every timer shrinks by the same factor: then a heartbeat is
    still one report in 4, a cached credential serves as many reports, an egress counter is
    flushed by time as often. Without this the short poll hides those costs (40 reports per
    heartbeat instead of 4). Read after django.setup(): the settings' own values."""
    from django.conf import settings

    factor = min(1.0, poll / FLEET_POLL)
    return {name: max(1, round(getattr(settings, name) * factor)) for name in TIMERS}


def enrol_fleet(n: int, offset: int) -> list[dict]:
    """N nodes with agents and two running leases each; returns each node's credential and
    private key (raw) for the generator."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import (
        Encoding,
        NoEncryption,
        PrivateFormat,
        PublicFormat,
    )
    from django.contrib.auth.models import User
    from django.utils import timezone

    from fleet.crypto import secret_hash
    from fleet.models import NodeAgent
    from inventory.models import GpuSlot, Node, Offer, Site, SlotAllocation
    from rental.models import Image, Lease, LeaseState

    now = timezone.now()
    offer = (Offer.objects.filter(gpu_count__lte=8 // LEASES_PER_NODE).select_related("gpu_model")
             .order_by("-gpu_count").first())
    per_lease = offer.gpu_count
    gpu, site, image = offer.gpu_model, Site.objects.first(), Image.objects.first()
    customer, _ = User.objects.get_or_create(username="bench-fleet")
    nodes = Node.objects.bulk_create([
        Node(site=site, name=f"bench-{offset + i:06d}", gpu_model=gpu, gpu_count=8, vcpus=128, host_ram_gb=1024)
        for i in range(n)], batch_size=2000)
    slots = GpuSlot.objects.bulk_create([GpuSlot(node=node, index=i) for node in nodes for i in range(8)],
                                        batch_size=5000)
    leases = Lease.objects.bulk_create([
        Lease(customer=customer, offer=offer, site=site, image=image, state=LeaseState.ACTIVE, term="week",
              price_cents=offer.weekly_cents, ssh_public_key="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBench bench",
              pay_by=now, started_at=now, ends_at=now + timedelta(days=7), provisioning_started_at=now,
              host="203.0.113.7", ssh_port=22000 + j)
        for node in nodes for j in range(LEASES_PER_NODE)], batch_size=2000)
    SlotAllocation.objects.bulk_create([
        SlotAllocation(slot=slots[8 * k + per_lease * j + g], lease_id=leases[LEASES_PER_NODE * k + j].pk)
        for k in range(n) for j in range(LEASES_PER_NODE) for g in range(per_lease)], batch_size=5000)
    fleet, agents = [], []
    for k, node in enumerate(nodes):
        key = Ed25519PrivateKey.generate()
        credential = base64.b16encode(os.urandom(24)).decode().lower()
        public = base64.b64encode(key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)).decode()
        agents.append(NodeAgent(node=node, credential_hash=secret_hash(credential), public_key=public,
                                enrolled_at=now, last_seq=0, agent_version="0.1.0", hostname=node.name,
                                gpu_library="nvml"))
        fleet.append({"node": node.name, "credential": credential,
                      "key": key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption()),
                      "leases": [leases[LEASES_PER_NODE * k + j].pk for j in range(LEASES_PER_NODE)]})
    NodeAgent.objects.bulk_create(agents, batch_size=2000)
    return fleet


def report_body(node: dict, seq: int, op_ids: dict[int, str], egress: int, desired_etag: str | None = None,
                with_gpus: bool = True, telemetry: bool = False) -> bytes:
    """A report as the agent sends it: since the steady poll (desired_etag given) the GPUs only
    when they changed or every 20th report (nodeagent/agent.py FULL_GPU_REPORT_EVERY)."""
    from django.utils import timezone

    from fleet.timeutil import rfc3339

    gpus = [{"index": i, "uuid": f"GPU-{node['node']}-{i}", "name": "NVIDIA H100 80GB HBM3", "memory_mb": 81559,
             "driver": "550.54.15", "cuda": "12.4", "temperature_c": 40 + i, "ecc_uncorrected": 0, "xid_errors": [],
             "healthy": True, "problem": "", "conditions": [],
             "topology": {"pcie_gen": 5, "pcie_max_gen": 5, "pcie_width": 16, "pcie_max_width": 16,
                          "nvlink_active": 18, "nvlink_peers": [j for j in range(8) if j != i], "mig": False}}
            for i in range(8)]
    instances = [{"lease_id": lease, "op_id": op_ids.get(lease, ""), "state": "running", "ssh_port": 22000 + j,
                  "egress_bytes": egress, "error": None} for j, lease in enumerate(node["leases"])]
    # the last minutes of 8 busy cards (recent: those cards' leases hold them now)
    samples = {"telemetry": {"start": int(time.time() // 60) - TELEMETRY_MINUTES + 1, "events": [], "samples": [
        [m, i, random.randint(60, 100), 60000 + random.randint(0, 9000), 55 + random.randint(0, 15),
         random.randint(400, 700), random.choice((1755, 1785, 1980))]
        for m in range(TELEMETRY_MINUTES) for i in range(8)]}} if telemetry else {}
    return json.dumps({"seq": seq, "sent_at": rfc3339(timezone.now()), "agent_version": "0.1.0",
                       "public_host": "203.0.113.7", "gpu_library": "nvml", **({"gpus": gpus} if with_gpus else {}),
                       "instances": instances, "evidence": [], **samples,
                       **({"desired_etag": desired_etag} if desired_etag is not None else {})},
                      separators=(",", ":")).encode()
