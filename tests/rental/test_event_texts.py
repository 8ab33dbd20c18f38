"""Every event a service records is shown in the reader's language: its kind has a sentence
(rental/templatetags/lease_events.EVENT_TEXT) and a fixed reason it stores is one makemessages
finds (KNOWN_REASONS), so a Chinese page never shows an English code or reason."""
import re
from pathlib import Path

from rental.templatetags.lease_events import EVENT_TEXT, KNOWN_REASONS

ROOT = Path(__file__).resolve().parents[2]
APPS = ("rental", "billing", "fleet", "inventory")
CALL = re.compile(r"\b(?:event_record|event_row|_transition|_transition_many)\(")


def recorded() -> tuple[set[str], set[str]]:
    kinds, reasons = set(), set()
    for app in APPS:
        for path in (ROOT / app).rglob("*.py"):
            if "migrations" in path.parts:
                continue
            text = path.read_text()
            for call in CALL.finditer(text):
                args = text[call.end():call.end() + 400]
                if kind := re.search(r'kind="([a-z_]+)"', args):
                    kinds.add(kind.group(1))
                if reason := re.search(r'reason="([^"]+)"', args):
                    reasons.add(reason.group(1))
    return kinds, reasons


def test_every_recorded_event_kind_and_fixed_reason_is_translatable():
    kinds, reasons = recorded()
    assert {"workbench_set", "workbench_changed", "paid"} <= kinds   # the scan finds the calls
    assert sorted(kinds - set(EVENT_TEXT)) == []
    assert sorted(reasons - set(KNOWN_REASONS)) == []
