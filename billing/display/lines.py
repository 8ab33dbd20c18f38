"""Invoice lines in the reader's language. Lines are stored in English, the
language of the audit trail and of the operator's exports, and shown through these patterns,
so a Chinese reader sees Chinese lines on an order placed in English and the other way round.
A line that matches no pattern (an older one, or an operator's text) is shown as stored."""
import re

from django.utils.translation import gettext_lazy as _

from inventory.models import StorageProduct
from rental.models import Term

_TERMS = {"1 week (7 days)": Term.WEEK, "1 month (30 days)": Term.MONTH}  # as stored (English)
_PRODUCTS = {"Extra local NVMe": StorageProduct.Kind.EXTRA_NVME, "Network volume": StorageProduct.Kind.NETWORK_VOLUME,
             "Snapshot": StorageProduct.Kind.SNAPSHOT}
_TERM = r"(?P<term>1 week \(7 days\)|1 month \(30 days\))"
PATTERNS = [
    (re.compile(rf"^Renewal of lease #(?P<id>\d+): (?P<offer>.+), {_TERM}$"),
     _("Renewal of lease #%(id)s: %(offer)s, %(term)s")),
    (re.compile(rf"^(?P<product>Extra local NVMe|Network volume|Snapshot), {_TERM}, per TB$"),
     _("%(product)s, %(term)s, per TB")),
    (re.compile(r"^Egress beyond (?P<included>[\d.]+) TB included, term from (?P<start>[\d-]+): (?P<tb>[\d.]+) TB at "
                r"\$(?P<price>[\d.]+)/TB \(per 0\.01 TB\)$"),
     _("Egress beyond %(included)s TB included, term from %(start)s: %(tb)s TB at $%(price)s/TB (per 0.01 TB)")),
    (re.compile(r"^Balance top-up$"), _("Balance top-up")),
    (re.compile(rf"^(?P<offer>.+), {_TERM}$"), _("%(offer)s, %(term)s")),
]


def _localise(groups: dict) -> dict:
    out = dict(groups)
    if "term" in out:
        out["term"] = Term(_TERMS[out["term"]]).label
    if "product" in out:
        out["product"] = StorageProduct.Kind(_PRODUCTS[out["product"]]).label
    return out


def line_text(description: str) -> str:
    for pattern, translated in PATTERNS:
        if match := pattern.match(description or ""):
            return str(translated) % _localise(match.groupdict())
    return description
