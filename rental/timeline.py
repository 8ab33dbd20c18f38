"""A lease's deadlines as a timeline: the order page shows the future one for a chosen
term, the lease pages the real one (with projections for deadlines not yet set). Pure
computation; the templates draw it as an inline SVG plus a list, no JavaScript."""
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from . import rules
from .models import ENDED_ON_HOST, Lease, LeaseState

SVG_WIDTH, SVG_PAD, LEVEL_GAP, MIN_SPACING = 720, 24, 18, 22
#: the phone drawing: in a 320 px column (the order page's on a phone) its labels are drawn at their own size
SVG_NARROW_WIDTH = 320


@dataclass(frozen=True)
class Milestone:
    key: str
    label: str
    at: datetime


@dataclass(frozen=True)
class Point:
    number: int
    key: str
    label: str
    at: datetime
    countdown: str
    past: bool
    x: int
    y: int


def countdown(at: datetime, now: datetime) -> str:
    """'in 3 d 4 h', 'in 25 min', '2 d 1 h ago'."""
    seconds = int((at - now).total_seconds())
    if abs(seconds) < 60:
        return _("now")  # not "in 0 min" (or "0 分钟后") for what is happening this minute
    days, rest = divmod(abs(seconds), 86_400)
    hours, rest = divmod(rest, 3600)
    minutes = rest // 60
    if days:
        span = _("%(d)d d %(h)d h") % {"d": days, "h": hours}
    elif hours:
        span = _("%(h)d h %(m)d min") % {"h": hours, "m": minutes}
    else:
        span = ngettext("%(n)d min", "%(n)d min", minutes) % {"n": minutes}
    return _("in %(span)s") % {"span": span} if seconds >= 0 else _("%(span)s ago") % {"span": span}


def reminder_label(lead: timedelta) -> str:
    hours = int(lead.total_seconds() // 3600)
    if hours % 24 == 0:
        return ngettext("Reminder: %(n)d day left (e-mail and in-app)", "Reminder: %(n)d days left (e-mail and in-app)",
                        hours // 24) % {"n": hours // 24}
    return ngettext("Reminder: %(n)d hour left (e-mail and in-app)", "Reminder: %(n)d hours left (e-mail and in-app)",
                    hours) % {"n": hours}


def term_milestones(*, start: datetime, end: datetime) -> list[Milestone]:
    """What happens from the start of a term to the wipe, for any lease: the moments the
    sweeps act on, from the same settings (rental.rules). The hold and the wipe are
    projected from a stop at the term's end; once suspended, the lease's own are shown."""
    hold, wipe = rules.hold(), rules.wipe_within()
    return [
        Milestone("start", _("Term starts (when the instance is ready)"), start),
        *(Milestone(kind, reminder_label(lead), end - lead) for kind, lead in rules.reminders()),
        Milestone("renewal", _("Renewal invoice issued, same price (auto-paid from balance if enabled)"),
                  end - rules.renewal_lead()),
        Milestone("end", _("Term ends (T): unpaid → instance stopped, slots held"), end),
        Milestone("hold", _("Hold ends (%(hours)d h after the stop): slots released")
                  % {"hours": hold.total_seconds() // 3600}, end + hold),
        Milestone("key", _("NVMe encryption key destroyed (with receipt)"), end + hold),
        Milestone("wipe", _("Local NVMe wiped (at the latest %(days)d days after the stop)")
                  % {"days": wipe.days}, end + wipe),
    ]


def order_milestones(*, now: datetime, term_length: timedelta, pay_window: timedelta) -> list[Milestone]:
    """The future of an order placed now and paid at once."""
    return [Milestone("pay_by", _("Payment window closes (slots held until then)"), now + pay_window),
            *term_milestones(start=now, end=now + term_length)]


def lease_milestones(lease: Lease, now: datetime) -> list[Milestone]:
    """The real deadlines of a lease, projected where not yet set."""
    ordered = Milestone("ordered", _("Ordered"), lease.created_at)
    if lease.state in (*ENDED_ON_HOST, LeaseState.WIPED):
        items = [ordered]
        if lease.started_at:
            items.append(Milestone("start", _("Term started"), lease.started_at))
        if lease.ended_at:
            items.append(Milestone("ended", _("Ended: %(state)s") % {"state": lease.get_state_display()},
                                   lease.ended_at))
        destroyed_at = getattr(getattr(lease, "disk_key", None), "destroyed_at", None)
        if destroyed_at:
            items.append(Milestone("key", _("NVMe encryption key destroyed (with receipt)"), destroyed_at))
        if lease.wipe_by:
            items.append(Milestone("wipe", _("Local NVMe wiped (by)"), lease.wipe_by))
        return items
    if lease.state == LeaseState.PENDING or not lease.ends_at:
        start = max(now, lease.created_at)
        return [ordered, Milestone("pay_by", _("Payment window closes"), lease.pay_by),
                *term_milestones(start=start, end=start + lease.term_length)]
    items = [ordered, *term_milestones(start=lease.started_at or lease.created_at, end=lease.ends_at)]
    if lease.hold_until:
        items = [m if m.key not in ("hold", "key") else Milestone(m.key, m.label, lease.hold_until) for m in items]
    if lease.wipe_by:
        items = [m if m.key != "wipe" else Milestone(m.key, m.label, lease.wipe_by) for m in items]
    return items


#: At most this many incidents are drawn on a lease's timeline (the newest; the page lists more).
INCIDENTS_ON_TIMELINE = 3


def incident_milestones(downtimes) -> list[Milestone]:
    """The incidents that hit the lease (inventory.Downtime rows, newest first, as the lease
    page lists them): when each began and, once over, when it ended. Out of service counts
    towards the SLA, so the customer sees it beside the term's own deadlines."""
    items = []
    for d in list(downtimes)[:INCIDENTS_ON_TIMELINE]:
        label = (_("Incident: out of service") if d.kind == "down" else _("Incident: degraded"))
        items.append(Milestone("incident", label, d.starts_at))
        if d.ends_at:
            items.append(Milestone("incident_end", _("Incident over"), d.ends_at))
    return items


def layout(milestones: list[Milestone], now: datetime) -> dict:
    """Positions for the SVG: x by time; markers closer than MIN_SPACING stack upwards.
    Drawn twice: SVG_WIDTH units wide and SVG_NARROW_WIDTH for a column under 660 px
    (site.css picks one), where the wide drawing would shrink its labels to 5 or 6 px."""
    items = sorted(milestones, key=lambda m: m.at)
    wide = _drawing(items, now, SVG_WIDTH)
    return {**wide, "narrow": _drawing(items, now, SVG_NARROW_WIDTH),
            "upcoming": [p for p in wide["points"] if not p.past]}


def _drawing(items: list[Milestone], now: datetime, width: int) -> dict:
    first, last = items[0].at, items[-1].at
    span = max((last - first).total_seconds(), 1)
    usable = width - 2 * SVG_PAD

    def x_of(at: datetime) -> int:
        return SVG_PAD + round(usable * (at - first).total_seconds() / span)

    points, prev_x, level = [], None, 0
    for number, m in enumerate(items, start=1):
        x = x_of(m.at)
        level = level + 1 if prev_x is not None and x - prev_x < MIN_SPACING and level < 3 else 0
        prev_x = x if level == 0 else prev_x
        points.append(Point(number, m.key, str(m.label), m.at, countdown(m.at, now), m.at < now, x,
                            70 - level * LEVEL_GAP))
    now_x = x_of(now) if first <= now <= last else None
    return {"points": points, "now_x": now_x, "width": width, "axis_y": 80, "first": first, "last": last,
            "variant": "wide" if width == SVG_WIDTH else "narrow"}
