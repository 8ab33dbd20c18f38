"""What a node's report says of its instances (PROTOCOL.md, the report's `instances`): each
item checked on its own, a steady one written nothing, the rest stored with their published
ports, image pull, volumes and snapshot progress, and the bytes sent metered for egress
(fleet/reports.py checks the envelope and reads the other items)."""
from datetime import datetime
from decimal import Decimal

from django.conf import settings
from django.db import transaction

from billing.egress import egress_record, egress_tb, term_start_at
from inventory.models import SlotAllocation
from rental.models import Lease, Snapshot
from rental.storage import snapshot_progress
from storage.volumes import mounts_record

from .evidence import Refused
from .models import InstanceReport, NodeAgent
from .steady import (
    StoredReport,
    locked_report,
    meter_add,
    report_update,
    reports_writing,
    reports_written,
    stored_reports,
)

#: At most this many items in each of a report's lists (gpus, instances, evidence; fleet/reports.py
#: reads it from here).
MAX_ITEMS = 256
BYTES_PER_TB = 10**12


class _Instances:
    """The node's stored instance reports among those the report lists, and which of those
    leases are on the node, read once for the whole report, not twice per instance.
    A stored report proves its lease held slots on the node (nothing else is accepted, and
    allocations are released, never deleted), so only leases without one are looked up.
    The instance reports written are put back in the node's copy (fleet/steady.py) at the end."""

    def __init__(self, node_id: int, items, cached: dict):
        ids = [i["lease_id"] for i in items if isinstance(i, dict) and type(i.get("lease_id")) is int] \
            if isinstance(items, list) and len(items) <= MAX_ITEMS else []
        self.node_id = node_id
        self.reports = stored_reports(node_id, ids, cached) if ids else {}
        unknown = [i for i in ids if i not in self.reports]
        self.on_node = set(self.reports) | (set(SlotAllocation.objects.filter(
            slot__node_id=node_id, lease_id__in=unknown).values_list("lease_id", flat=True)) if unknown else set())
        self._written: dict[int, StoredReport] | None = None

    def writing(self) -> None:
        """An instance report is about to be written: the node's copy goes (once a report)."""
        if self._written is None:
            reports_writing(self.node_id)
            self._written = {}

    def written(self, stored: StoredReport) -> None:
        self._written[stored.lease_id] = stored

    def done(self) -> None:
        """The copy is what the table holds now, once the writes are committed."""
        if self._written:
            reports_written(self.node_id, {**self.reports, **self._written})


_INSTANCE_STATES = frozenset(InstanceReport.State.values)   # `.values` builds a list on every read


#: At most this many published ports in one instance's report (the storefront asks for at most
#: WORKBENCH_MAX_PORTS; a node may report fewer, never a flood).
MAX_REPORTED_PORTS = 64


def _reported_ports(value) -> dict | None:
    """{"8888": 31002}: container port (a decimal string) -> the host port it is published on;
    anything else from a node is refused, not stored (the lease page builds addresses of it)."""
    if value is None:
        return None
    if not isinstance(value, dict) or len(value) > MAX_REPORTED_PORTS:
        raise Refused("invalid_ports")
    out = {}
    for container, host in value.items():
        if not isinstance(container, str) or not container.isdigit() or len(container) > 5 or                 not 0 < int(container) < 65536 or type(host) is not int or not 0 < host < 65536:
            raise Refused("invalid_ports")
        out[str(int(container))] = host
    return out


def _reported_pull(value) -> dict | None:
    """{"done_bytes": n, "total_bytes": m} while the node pulls the image (total 0: unknown yet)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise Refused("invalid_pull")
    done, total = value.get("done_bytes"), value.get("total_bytes", 0)
    if type(done) is not int or type(total) is not int or not 0 <= done < 2**62 or not 0 <= total < 2**62:
        raise Refused("invalid_pull")
    return {"done_bytes": done, "total_bytes": total}


def _unchanged(report: StoredReport | None, item: dict, port, op_id: str, error, egress: int, now: datetime) -> bool:
    """A steady instance — same state, port, op and error, no volumes or snapshot
    news — whose egress grew less than NODE_EGRESS_FLUSH_BYTES since the stored counter, which
    is younger than NODE_EGRESS_FLUSH_SECONDS: nothing is written. The counter is cumulative, so
    the next stored report meters the bytes in between (egress aggregated, not a row per poll)."""
    if report is None or item.get("volumes") is not None or item.get("snapshot") is not None:
        return False
    if (report.state, report.ssh_port, report.op_id, report.error) != (item["state"], port, op_id, error):
        return False
    if (report.ports, report.pull) != (item.get("ports"), item.get("pull")):
        return False
    grown = egress - report.egress_counter
    if report.egress_counter == 0 and grown > 0:
        return False                       # the first bytes are metered at once
    return 0 <= grown < settings.NODE_EGRESS_FLUSH_BYTES and \
        (now - report.reported_at).total_seconds() < settings.NODE_EGRESS_FLUSH_SECONDS


def _instance(agent: NodeAgent, item, now: datetime, *, known: _Instances) -> None:
    if not isinstance(item, dict):
        raise Refused("invalid")
    lease_id, state, op_id = item.get("lease_id"), item.get("state"), item.get("op_id", "")
    port, egress, error = item.get("ssh_port"), item.get("egress_bytes", 0), item.get("error")
    # A frozenset cannot be asked about a list or an object (unhashable): strings only.
    if type(lease_id) is not int or not 0 < lease_id < 2**62 or type(state) is not str or \
            state not in _INSTANCE_STATES:
        raise Refused("invalid")
    if not isinstance(op_id, str) or len(op_id) > 80:
        raise Refused("invalid")
    if port is not None and (type(port) is not int or not 0 < port < 65536):
        raise Refused("invalid")
    if type(egress) is not int or not 0 <= egress < 2**62:
        raise Refused("invalid")
    if error is not None and not (isinstance(error, dict) and isinstance(error.get("code"), str)):
        raise Refused("invalid")
    if lease_id not in known.on_node:
        raise Refused("unknown_lease")
    if error is not None:
        error = {"code": error["code"][:40], "detail": str(error.get("detail") or "")[:500]}
    item = {**item, "ports": _reported_ports(item.get("ports")), "pull": _reported_pull(item.get("pull"))}
    if _unchanged(known.reports.get(lease_id), item, port, op_id, error, egress, now):
        return
    known.writing()
    with transaction.atomic():
        stored = _instance_store(agent, item, lease_id, state, op_id, port, egress, error, now)
    known.written(stored)


def _instance_store(agent: NodeAgent, item: dict, lease_id: int, state: str, op_id: str, port, egress: int, error,
                    now: datetime) -> StoredReport:
    report, lease, network_gbps = locked_report(lease_id, agent.node_id)
    previous = report.egress_counter if report else 0
    since = report.reported_at if report else None
    if (egress - previous if egress >= previous else egress) > egress_ceiling(lease, since, network_gbps, now):
        raise Refused("egress_implausible")  # nothing stored: the last plausible counter stays
    values = {"state": state, "ssh_port": port, "op_id": op_id, "error": error, "egress_counter": egress,
              "reported_at": now, "ports": item.get("ports"), "pull": item.get("pull")}
    if report is None:                     # the first: update_or_create settles a concurrent one
        InstanceReport.objects.update_or_create(lease_id=lease_id, node_id=agent.node_id, defaults=values)
    else:                                  # locked above: an UPDATE, not update_or_create's read again
        report_update(report.pk, values)
    if isinstance(item.get("volumes"), list):  # mounted, or the named failure
        mounts_record(node=agent.node, lease_id=lease_id, items=item["volumes"], now=now)
    _snapshot_progress(lease_id, item.get("snapshot"), now)
    # The counter restarts at 0 with a new instance (a migration, a re-created container).
    sent = egress - previous if egress >= previous else egress
    if sent > 0:
        _meter_egress(lease, sent, now)
    return StoredReport(lease_id, state, port, op_id, error, egress, now, item.get("ports"), item.get("pull"))


def _snapshot_progress(lease_id: int, item, now: datetime) -> None:
    """Progress or the named failure of the lease's snapshot, for the customer;
    only the signed `snapshot_taken` evidence makes it ready."""
    if not isinstance(item, dict) or type(item.get("snapshot_id")) is not int or not isinstance(item.get("op_id"), str):
        return
    if Snapshot.objects.filter(pk=item["snapshot_id"], source_lease_id=lease_id).exists():
        snapshot_progress(snapshot_id=item["snapshot_id"], op_id=item["op_id"][:80], report=item, now=now)


def egress_ceiling(lease: Lease, since: datetime | None, network_gbps: int | None, now: datetime) -> int:
    """The most an instance can have sent since its last report (`since`; None:
    since the lease started), at its link speed (the offer's network_gbps, else
    NODE_LINK_GBPS) for the time elapsed, plus EGRESS_SLACK_BYTES; a node once reported 1 PB
    in a minute."""
    since = since or lease.started_at or lease.provisioning_started_at or lease.created_at
    seconds = max(0.0, (now - since).total_seconds())
    gbps = network_gbps or settings.NODE_LINK_GBPS
    return int(gbps * 10**9 / 8 * seconds) + settings.EGRESS_SLACK_BYTES


def _meter_egress(lease: Lease, sent: int, now: datetime) -> None:
    term_start = term_start_at(lease, now)
    if term_start is None:
        return  # no paid term (never started): nothing to bill
    total = meter_add(lease.pk, term_start, sent)
    if total > sent and egress_tb(Decimal(total) / BYTES_PER_TB) == egress_tb(Decimal(total - sent) / BYTES_PER_TB):
        return  # the billed figure (to the GB) is unchanged, and was recorded with the earlier bytes
    egress_record(lease_id=lease.pk, tb_used=Decimal(total) / BYTES_PER_TB, at=now, lease=lease)
