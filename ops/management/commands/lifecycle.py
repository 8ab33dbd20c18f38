"""`manage.py lifecycle [--dry-run] [--at ISO-8601]`: one lifecycle pass (every sweep
once), the same as a Celery beat tick, printing each transition. Lives in ops, with the pass:
it runs rental's and billing's sweeps, so it sits above both."""
from datetime import UTC, datetime

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from ops.lifecycle import SKIPPED, UNPREVIEWABLE_SWEEPS, run_lifecycle, run_lifecycle_exclusive


def parse_at(value: str) -> datetime:
    try:
        at = datetime.fromisoformat(value.strip().replace(" ", "T", 1))
    except ValueError as exc:
        raise CommandError(f"--at {value!r} is not an ISO-8601 date-time (e.g. 2026-12-01T12:00:00Z)") from exc
    return at if timezone.is_aware(at) else at.replace(tzinfo=UTC)


class Command(BaseCommand):
    help = "Run (or preview with --dry-run) every lifecycle sweep once, printing each transition."

    def add_arguments(self, parser):
        parser.add_argument("--dry-run", action="store_true",
                            help="Show what would happen, then roll everything back; hosts are left alone.")
        parser.add_argument("--at", metavar="ISO-8601",
                            help="Pretend it is this moment (UTC when no offset). Needs --dry-run unless DEBUG.")

    def handle(self, *args, dry_run=False, at=None, **options):
        now = parse_at(at) if at else timezone.now()
        if at and not dry_run and not settings.DEBUG:
            raise CommandError("--at moves real leases by a pretended clock: use it with --dry-run, "
                               "or on a development machine with DEBUG=1.")
        # A dry run rolls back and leaves hosts alone, so it needs no lock.
        results = run_lifecycle(now, dry_run=True) if dry_run else run_lifecycle_exclusive(now)
        if results is None:
            self.stdout.write(SKIPPED)
            return
        for sweep, transition in results:
            self.stdout.write(f"{sweep} lease#{transition.lease_id} {transition.what}")
        if dry_run:
            self.stdout.write(f"not previewed (they act on the storage cluster): {', '.join(sorted(UNPREVIEWABLE_SWEEPS))}")
        verb = "would be made (dry run, rolled back)" if dry_run else "made"
        self.stdout.write(f"{len(results)} transition(s) {verb} at {now.isoformat()}")
