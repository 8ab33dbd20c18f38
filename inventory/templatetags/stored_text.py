"""Text that services store in English for the audit trail (event reasons, ledger memos)
shown in the reader's language: known phrases through the catalog, known patterns with
their numbers kept ("invoice #12" → "账单 #12"); anything else as stored."""
import re

from django import template
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

register = template.Library()

PATTERNS = [  # (stored form, translatable form with the same named numbers)
    (re.compile(r"^renewal invoice #(?P<id>\d+) paid$"), _("renewal invoice #%(id)s paid")),
    (re.compile(r"^invoice #(?P<id>\d+) paid after its lease ended$"), _("invoice #%(id)s paid after its lease ended")),
    (re.compile(r"^invoice #(?P<id>\d+) not paid within the payment window$"),
     _("invoice #%(id)s not paid within the payment window")),
    (re.compile(r"^invoice #(?P<id>\d+)$"), _("invoice #%(id)s")),
    (re.compile(r"^refund of lease #(?P<id>\d+)$"), _("refund of lease #%(id)s")),
    # storage terms from the balance (storage.charges._charge_term) and other ledger memos
    (re.compile(r"^network volume #(?P<id>\d+), (?P<tb>\d+) TB × 30 days from (?P<start>[\d-]+)$"),
     _("network volume #%(id)s, %(tb)s TB × 30 days from %(start)s")),
    (re.compile(r"^snapshot #(?P<id>\d+), (?P<tb>\d+) TB × 30 days from (?P<start>[\d-]+)$"),
     _("snapshot #%(id)s, %(tb)s TB × 30 days from %(start)s")),
    (re.compile(r"^lease #(?P<id>\d+) could not be provisioned$"), _("lease #%(id)s could not be provisioned")),
    # lease event reasons with numbers or names in them
    (re.compile(r"^incident #(?P<id>\d+): .*$"), _("incident #%(id)s: hardware out of service")),
    (re.compile(r"^instance ready on node (?P<node>[\w.-]+)$"), _("instance ready on server %(node)s")),
    # the copy of a moved lease's disk on the node it left (rental.disk_keys.lease_copy_sanitized)
    (re.compile(r"^disk copy key destroyed on node (?P<node>[\w.-]+)$"),
     _("key of the disk copy on server %(node)s destroyed")),
    (re.compile(r"^disk copy wiped on node (?P<node>[\w.-]+)$"), _("disk copy on server %(node)s wiped")),
    (re.compile(r"^disk copy wipe failed on node (?P<node>[\w.-]+)$"),
     _("wipe of the disk copy on server %(node)s failed")),
]


@register.filter
def stored_text(text: str) -> str:
    if not text:
        return ""
    for pattern, translated in PATTERNS:
        if match := pattern.match(text):
            return str(translated) % match.groupdict()
    return gettext(text)
