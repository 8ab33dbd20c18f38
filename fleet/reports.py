"""A node's signed report (PROTOCOL.md, `POST /agent/v1/report`): the envelope is checked
as a whole (signature over the raw body, then seq and sent_at, so a replay or a forgery
changes nothing), then every item on its own — GPUs (health → incidents), instances
(fleet/instance_reports.py: observed state, egress metering) and evidence — and one bad item
never blocks the others. Here: the envelope, the node's facts, its GPUs and its evidence."""
import re
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial

from django.conf import settings
from django.db import transaction

from inventory.burnin import burn_in_after_reboot, slot_health_hold_set
from inventory.incidents import health_report
from inventory.models import Node, SlotAllocation
from inventory.selectors import catalog_changed
from rental.addresses import valid_host
from rental.agent import Instance
from rental.models import Lease, LeaseState
from rental.services import lease_connection_update

from .burnin import burn_in_accept
from .conditions import DRAIN, INCIDENT, split_by_rule
from .credentials import forget, remember
from .crypto import signature_valid
from .evidence import Refused, evidence_accept
from .instance_reports import MAX_ITEMS, _instance, _Instances
from .jsonbody import parse_json
from .models import NodeAgent
from .seq import Verdict, fence_after, fence_bound, seq_checkpointed, seq_take
from .steady import agent_as_stored, gpu_slots, steady_agent_update
from .telemetry import telemetry_accept
from .timeutil import parse_time

CONDITION_CODE_RE = re.compile(r"^[a-z0-9_]{1,40}$")
BOOT_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")  # /proc/sys/kernel/random/boot_id


class ReportRefused(Exception):
    """The whole report is refused: HTTP `status` with `{"error": code}`."""

    def __init__(self, status: int, code: str):
        super().__init__(code)
        self.status, self.code = status, code


@dataclass
class Outcome:
    accepted: list[str] = field(default_factory=list)
    refused: list[dict] = field(default_factory=list)
    #: The ETag of the desired state the agent holds, when it asks for it in the answer
    #: (None: an agent that polls GET /agent/v1/desired itself).
    desired_etag: str | None = None

    def as_json(self) -> dict:
        return {"accepted": self.accepted, "refused": self.refused}


def _envelope(agent: NodeAgent, body: bytes, signature: str, now: datetime) -> dict:
    if not signature_valid(public_key=agent.public_key, signature=signature, message=body):
        raise ReportRefused(401, "bad_signature")
    try:
        data = parse_json(body)
    except ValueError:
        raise ReportRefused(400, "invalid_json") from None
    if not isinstance(data, dict):
        raise ReportRefused(400, "invalid_report")
    seq = data.get("seq")
    if type(seq) is not int or not 0 < seq < 2**62:
        raise ReportRefused(400, "invalid_seq")
    sent_at = parse_time(data.get("sent_at"))
    if sent_at is None:
        raise ReportRefused(400, "invalid_sent_at")
    if abs(now - sent_at) > settings.NODE_REPORT_MAX_SKEW:
        raise ReportRefused(400, "stale")
    return data


@dataclass
class Envelope:
    """A report's envelope checked (signature over the raw body, JSON, seq, sent_at) and the
    node's facts read from it, before its seq is taken. `verdict`: Redis's verdict on the
    seq when the view took it already (in the poll's one round trip, fleet/seq.py)."""
    data: dict
    facts: dict
    refused: list[dict]
    verdict: Verdict | None = None


def report_envelope(agent: NodeAgent, body: bytes, signature: str, now: datetime) -> Envelope:
    data = _envelope(agent, body, signature, now)
    outcome = Outcome()
    return Envelope(data, _reported_facts(data, outcome), outcome.refused)


def report_accept(*, agent: NodeAgent, body: bytes, signature: str, now: datetime, cached: dict | None = None,
                  envelope: Envelope | None = None) -> Outcome:
    """`cached`: the cache keys the view read with the poll (the node's stored instance
    reports, fleet/steady.py), if any; `envelope`: the view's report_envelope of this body,
    checked with this agent's key."""
    if envelope is None:
        envelope = report_envelope(agent, body, signature, now)
    data, outcome = envelope.data, Outcome(refused=list(envelope.refused))
    if isinstance(data.get("desired_etag"), str):
        outcome.desired_etag = data["desired_etag"][:80]
    # The seq check: a replay stops here, changing nothing.
    agent = _node_facts(agent, envelope, now, body=body, signature=signature)
    _boot_seen(agent, data.get("boot_id"), now)
    slots = _GpuSlots(agent)
    instances = _Instances(agent.node_id, data.get("instances"), cached or {})
    for name, apply in (("gpus", partial(_gpu, slots=slots)), ("instances", partial(_instance, known=instances)),
                        ("evidence", _evidence)):
        items = data.get(name) or []
        if not isinstance(items, list) or len(items) > MAX_ITEMS:
            outcome.refused.append({"item": name, "error": "invalid"})
            continue
        for i, item in enumerate(items):
            label = f"{name}[{i}]"
            try:
                if name == "evidence":
                    with transaction.atomic():
                        apply(agent, item, now)
                else:                      # each opens its own transaction, only to write
                    apply(agent, item, now)
            except Refused as exc:
                outcome.refused.append({"item": label, "error": exc.code})
            else:
                outcome.accepted.append(label)
    instances.done()
    telemetry_accept(outcome, agent.node_id, data.get("telemetry"), now)   # PROTOCOL.md "Telemetry"
    return outcome


# --- the node itself ----------------------------------------------------------------------

def _gpu_row(item) -> dict:
    if not isinstance(item, dict) or type(item.get("index")) is not int or type(item.get("healthy")) is not bool:
        raise Refused("invalid")
    row = {"index": item["index"], "healthy": item["healthy"]}
    for key in ("uuid", "name", "driver", "cuda", "problem"):
        row[key] = item[key][:120] if isinstance(item.get(key), str) else ""
    for key in ("memory_mb", "temperature_c", "ecc_uncorrected"):
        row[key] = item[key] if type(item.get(key)) is int and abs(item[key]) < 2**40 else None
    xids = item.get("xid_errors")
    row["xid_errors"] = [x for x in xids[:20] if type(x) is int] if isinstance(xids, list) else []
    row["conditions"] = _conditions(item.get("conditions"))
    row["topology"] = _topology(item.get("topology"))
    return row


def _conditions(items) -> list[dict] | None:
    """Named conditions (nodeagent/health.py); None when the agent sends none (an older
    agent: its `healthy` verdict is used instead)."""
    if not isinstance(items, list):
        return None
    return [{"code": c["code"], "detail": c["detail"][:200] if isinstance(c.get("detail"), str) else ""}
            for c in items[:20] if isinstance(c, dict) and isinstance(c.get("code"), str)
            and CONDITION_CODE_RE.match(c["code"])]


def _topology(item) -> dict:
    if not isinstance(item, dict):
        return {}
    small_int = lambda v: v if type(v) is int and 0 <= v <= 64 else None  # noqa: E731
    peers = item.get("nvlink_peers")
    return {"pcie_gen": small_int(item.get("pcie_gen")), "pcie_max_gen": small_int(item.get("pcie_max_gen")),
            "pcie_width": small_int(item.get("pcie_width")), "pcie_max_width": small_int(item.get("pcie_max_width")),
            "nvlink_active": small_int(item.get("nvlink_active")) or 0,
            "nvlink_peers": [x for x in peers[:16] if small_int(x) is not None] if isinstance(peers, list) else [],
            "mig": item.get("mig") is True}


def _node_facts(agent: NodeAgent, envelope: Envelope, now: datetime, *, body: bytes, signature: str) -> NodeAgent:
    """The seq guard and the node's facts in one UPDATE (a report writes one row
    of its own); a fact is written only when it changed. Returns the agent as stored now."""
    fields, seq = envelope.facts, envelope.data["seq"]
    verdict = envelope.verdict if envelope.verdict is not None else seq_take(agent, seq, fields, now)
    if verdict is Verdict.REPLAYED:
        raise ReportRefused(409, "replayed")
    if verdict is Verdict.TAKEN and "gpus" not in fields:
        return agent                              # the seq in Redis, nothing to write
    if _steady_update(agent, seq, fields, now, verdict):
        seq_checkpointed(agent, seq, fields, now, verdict)
        return agent
    agent = _fresh(agent, body, signature, now)     # the credential and key, from the database
    facts = fields
    fields = {"last_seq": seq, "seq_fence": fence_after(verdict, seq), "last_seen_at": now, "last_report_at": now,
              **fields}
    moved_host = agent.public_host and fields.get("public_host", agent.public_host) != agent.public_host
    changed = {k: v for k, v in fields.items() if k in ("last_seq", "seq_fence", "last_seen_at", "last_report_at")
               or getattr(agent, k) != v}
    if not NodeAgent.objects.filter(pk=agent.pk, last_seq__lt=seq,
                                    seq_fence__lt=fence_bound(verdict, seq)).update(**changed):
        raise ReportRefused(409, "replayed")
    for key, value in fields.items():
        setattr(agent, key, value)
    remember(agent)
    seq_checkpointed(agent, seq, facts, now, verdict)
    if "gpus" in fields:
        _nvlink_reported(agent.node, fields["gpus"])
    if moved_host:
        _follow_new_host(agent, now)
    return agent


def _boot_seen(agent: NodeAgent, boot_id, now: datetime) -> None:
    """The kernel's boot id the agent reports (PROTOCOL.md): kept apart from the seq-checked
    facts, as it changes once per boot. One that replaces a known one means the node
    rebooted: its idle cards are asked for a burn-in (the first one is enrolment's)."""
    if not isinstance(boot_id, str) or not BOOT_ID.fullmatch(boot_id) or boot_id == agent.boot_id:
        return
    previous = agent.boot_id
    written = NodeAgent.objects.filter(pk=agent.pk, boot_id=previous).update(boot_id=boot_id)
    agent.boot_id = boot_id     # 0 rows: another worker's report of this boot wrote it first
    remember(agent)
    if written and previous:
        burn_in_after_reboot(node=agent.node, now=now)


def _reported_facts(data: dict, outcome: Outcome) -> dict:
    fields = {}
    version, host, library = data.get("agent_version"), data.get("public_host"), data.get("gpu_library")
    if isinstance(version, str) and len(version) <= 40:
        fields["agent_version"] = version
    if valid_host(host) is not None:  # a host name or an IP address, never an ssh option
        fields["public_host"] = valid_host(host)
    elif host is not None:
        outcome.refused.append({"item": "public_host", "error": "invalid"})
    if library in ("nvml", "none"):
        fields["gpu_library"] = library
    gpus = data.get("gpus")
    if isinstance(gpus, list) and len(gpus) <= MAX_ITEMS:
        rows = []
        for item in gpus:
            try:
                rows.append(_gpu_row(item))
            except Refused:
                continue
        fields["gpus"] = rows
    return fields


def _steady_update(agent: NodeAgent, seq: int, fields: dict, now: datetime, verdict: Verdict) -> bool:
    """The steady report: its facts are the ones stored (they are conditions of
    the UPDATE, so an agent row cached by this worker cannot mislead it), the credential is
    still the agent's, unrevoked, with the key the signature was checked with — then the seq
    guard and the heartbeat are the one query (fleet/steady.py). False: anything else,
    decided from the row."""
    fence = fence_after(verdict, seq)
    if "gpus" in fields or not steady_agent_update(agent, seq, fields, now, fence=fence,
                                                   fence_below=fence_bound(verdict, seq)):
        return False
    for key, value in {**fields, "last_seq": seq, "seq_fence": fence, "last_seen_at": now}.items():
        setattr(agent, key, value)
    remember(agent)
    return True


def _fresh(agent: NodeAgent, body: bytes, signature: str, now: datetime) -> NodeAgent:
    """The agent's row as stored; refused when its credential was revoked or replaced since
    this worker cached it, re-checked when its key changed."""
    stored = agent_as_stored(agent.pk, agent.credential_hash)
    if stored is None:
        forget(agent.credential_hash)
        raise ReportRefused(401, "unauthorized")
    if stored.public_key != agent.public_key:
        forget(agent.credential_hash)
        _envelope(stored, body, signature, now)
    return stored


def _nvlink_reported(node, rows: list[dict]) -> None:
    """Whether every GPU of a multi-GPU node reaches a peer over NVLink, as its agent sees
    it: the recommendation's link rule trusts this over the catalog's label."""
    reported = [r["topology"] for r in rows if r.get("topology")]
    if len(reported) < 2:
        return
    ok = all(t["nvlink_peers"] for t in reported)
    if node.nvlink_reported is not ok:
        Node.objects.filter(pk=node.pk).update(nvlink_reported=ok)
        node.nvlink_reported = ok
        transaction.on_commit(catalog_changed)


def _follow_new_host(agent: NodeAgent, now: datetime) -> None:
    """The node answers at a new address: its running leases' connection lines follow."""
    on_node = SlotAllocation.objects.filter(slot__node=agent.node, released_at__isnull=True).values("lease_id")
    for lease in Lease.objects.filter(pk__in=on_node, state__in=[LeaseState.ACTIVE, LeaseState.SUSPENDED],
                                      ssh_port__isnull=False):
        lease_connection_update(lease_id=lease.pk, instance=Instance(host=agent.public_host, ssh_port=lease.ssh_port),
                                now=now, reason=f"node {agent.node.name} now answers at {agent.public_host}")


class _GpuSlots:
    """The node's slots and which have an open health-check incident, read once per report
    and only when it lists GPUs, in one query (a steady report of 8 healthy GPUs
    reads one set of rows, writes nothing, opens no transaction)."""

    def __init__(self, agent: NodeAgent):
        self.node_id, self._by_index, self._with_incident = agent.node_id, None, None

    def _load(self) -> None:
        if self._by_index is None:
            slots = gpu_slots(self.node_id)
            self._by_index = {s.index: s for s in slots}
            self._with_incident = {s.pk for s in slots if s.incident_open}

    @property
    def by_index(self) -> dict:
        self._load()
        return self._by_index

    @property
    def with_incident(self) -> set:
        self._load()
        return self._with_incident


def _gpu(agent: NodeAgent, item, now: datetime, *, slots: _GpuSlots) -> None:
    """healthy=false opens a GPU incident on the slot (once while it lasts); healthy
    again closes it (inventory.incidents.health_report). Nothing is written while the
    slot's state already says what the report says."""
    row = _gpu_row(item)
    slot = slots.by_index.get(row["index"])
    if slot is None:
        raise Refused("unknown_gpu")
    healthy, problem, codes = row["healthy"], row["problem"], None
    if row["conditions"] is not None:      # the rules table decides (fleet/conditions.py)
        by_rule = split_by_rule(row["conditions"])
        healthy, problem = not by_rule[INCIDENT], "; ".join(c["detail"] for c in by_rule[INCIDENT])
        codes = [c["code"] for c in by_rule[DRAIN]]
        if ",".join(sorted(set(codes))) == slot.health_hold:
            codes = None
    incident_changes = healthy == (slot.pk in slots.with_incident)
    if codes is None and not incident_changes:
        return                             # the slot already says what the report says
    with transaction.atomic():
        if codes is not None:
            slot_health_hold_set(node=agent.node, index=row["index"], codes=codes, now=now)
        if incident_changes:
            problem = problem or ("Xid " + ", ".join(map(str, row["xid_errors"])) if row["xid_errors"] else "")
            detail = f"GPU {row['index']} ({row['uuid'] or 'no uuid'}) unhealthy: {problem or 'reported by the node agent'}"
            health_report(node=agent.node, healthy=healthy, at=now, slot_index=row["index"],
                          detail=detail if not healthy else "GPU healthy again (node agent)")


def _evidence(agent: NodeAgent, item, now: datetime) -> None:
    if isinstance(item, dict) and item.get("kind") == "burn_in":
        burn_in_accept(agent=agent, record=item, now=now)
        return
    evidence_accept(agent=agent, record=item, now=now)
