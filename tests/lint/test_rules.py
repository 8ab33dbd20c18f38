"""scripts/lint_rules.py (ADR 0024): each rule catches a bad snippet and passes a good one,
and today's tree passes them all."""
import importlib.util
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("lint_rules", ROOT / "scripts" / "lint_rules.py")
lint_rules = importlib.util.module_from_spec(_spec)
sys.modules["lint_rules"] = lint_rules  # dataclasses look their module up
_spec.loader.exec_module(lint_rules)


def findings(source: str, path: str, rule: str) -> list:
    return lint_rules.check_source(textwrap.dedent(source), path, rules=[rule])


# (a) ledger rows only through billing/ledger.py

@pytest.mark.parametrize("bad", [
    "LedgerEntry.objects.create(account=a, amount_cents=5)",
    "LedgerEntry.objects.bulk_create([LedgerEntry(account=a)])",
    "LedgerEntry.objects.filter(pk=1).update(amount_cents=0)",
    "models.LedgerEntry.objects.get_or_create(account=a)",
    "Entry(account=a).save()",
])
def test_ledger_writes_outside_the_ledger_are_caught(bad):
    source = f"from billing.models import LedgerEntry\nfrom billing.models import LedgerEntry as Entry\n{bad}\n"
    assert findings(source, "billing/services.py", "ledger-writes")


def test_ledger_reads_and_posting_through_the_ledger_pass():
    good = """
        from billing.ledger import ledger_post
        from billing.models import LedgerEntry
        LedgerEntry.objects.filter(account=a).exists()
        ledger_post(customer=c, kind=LedgerEntry.Kind.TOPUP, amount_cents=5, now=now)
    """
    assert not findings(good, "billing/services.py", "ledger-writes")
    assert not findings("from .models import LedgerEntry\nLedgerEntry.objects.bulk_create(entries)\n",
                        "billing/ledger.py", "ledger-writes")


# (b) no network call inside a transaction

@pytest.mark.parametrize("bad", [
    """
    import requests
    def pay():
        with transaction.atomic():
            requests.post(url, json={})
    """,
    """
    from django.db import transaction
    @transaction.atomic
    def pay():
        notify_task.delay(1)
    """,
    """
    from django.db.transaction import atomic
    def pay():
        with atomic(using="default"):
            sweep.apply_async(args=(1,))
    """,
    """
    from urllib.request import urlopen
    @transaction.atomic()
    def pay():
        urlopen("https://x")
    """,
    """
    from django.core.mail import send_mail
    @transaction.atomic
    def notify():
        send_mail("s", "b", "from@x", ["to@x"])
    """,
    """
    from django.core import mail
    def notify():
        with transaction.atomic():
            mail.mail_admins("s", "b")
    """,
    """
    import smtplib, socket
    def pay():
        with transaction.atomic():
            with transaction.atomic():
                smtplib.SMTP("mail").sendmail(a, b, c)
            socket.create_connection(("h", 1))
    """,
])
def test_network_inside_a_transaction_is_caught(bad):
    assert findings(bad, "billing/payments/services.py", "network-in-atomic")


def test_a_name_that_is_not_the_imported_client_passes():
    good = """
        def approve(requests):
            with transaction.atomic():
                for r in requests.filter(state="open"):
                    r.approve()
    """
    assert not findings(good, "billing/services.py", "network-in-atomic")


def test_nested_blocks_report_a_call_once():
    bad = """
        def pay():
            with transaction.atomic():
                with transaction.atomic():
                    task.delay()
    """
    assert len(findings(bad, "billing/services.py", "network-in-atomic")) == 1


def test_network_after_commit_or_outside_the_transaction_passes():
    good = """
        import requests
        from django.db import transaction
        def pay():
            with transaction.atomic():
                row = Quote.objects.select_for_update().get(pk=1)
                transaction.on_commit(lambda: notify_task.delay(row.pk))
                transaction.on_commit(partial(sweep.apply_async, args=(1,)))
                def later():
                    requests.post(url)
                transaction.on_commit(later)
            requests.post(url)
            notify_task.delay(1)
    """
    assert not findings(good, "billing/services.py", "network-in-atomic")


# (c) row locks

def test_a_lock_in_a_module_outside_the_allow_list_is_caught():
    bad = "def f():\n    return Lease.objects.select_for_update().get(pk=1)\n"
    assert findings(bad, "rental/new_module.py", "row-locks")


def test_a_raw_for_update_outside_the_allow_list_is_caught():
    bad = 'cursor.execute(f"SELECT * FROM rental_lease WHERE id = %s FOR UPDATE", [1])\n'
    assert findings(bad, "rental/new_module.py", "row-locks")
    assert not findings(bad, "fleet/steady.py", "row-locks")


def test_an_account_lock_outside_the_ledger_is_caught_even_where_other_locks_are_allowed():
    bad = "from billing.models import Account\nAccount.objects.select_for_update().get(customer=c)\n"
    assert findings(bad, "billing/payments/credits.py", "row-locks")


def test_locks_in_allowed_modules_and_the_ledger_pass():
    assert not findings("Lease.objects.select_for_update().get(pk=1)\n", "rental/services.py", "row-locks")
    assert not findings("from .models import Account\nAccount.objects.select_for_update().get(customer=c)\n",
                        "billing/ledger.py", "row-locks")
    # S3Account is storage's own row, not a balance
    assert not findings("from .models import S3Account\nS3Account.objects.select_for_update().get(pk=1)\n",
                        "storage/objects.py", "row-locks")


def test_every_allowed_lock_has_a_reason():
    for table in (lint_rules.ROW_LOCKS_ALLOWED, lint_rules.ACCOUNT_LOCKS_ALLOWED,
                  lint_rules.MODULE_SIZE_ALLOWED):
        assert all(reason.strip() for reason in table.values())


# (d) no import from a test module

@pytest.mark.parametrize("bad", [
    "from tests.rental.test_new_thing import helper\n",
    "from .test_new_thing import helper\n",
    "import tests.rental.test_new_thing\n",
    "from tests.rental import test_new_thing\n",
])
def test_importing_from_a_test_module_is_caught(bad):
    assert findings(bad, "tests/rental/test_other.py", "test-imports")
    # none is exempt, not even a module whose helpers other tests once shared
    assert findings("from tests.ops.lifecycle.test_end_to_end import order\n", "tests/rental/test_x.py", "test-imports")


def test_importing_from_conftest_or_a_helper_module_passes():
    good = ("from tests.rental.helpers import lease\nfrom .conftest import node\nfrom tests.tools import need\n"
            "from tests.factories import order\nfrom .helpers import login\n")
    assert not findings(good, "tests/rental/test_other.py", "test-imports")


# (e) module size

def test_a_module_over_the_limit_is_caught_unless_allowed(monkeypatch):
    long = "x = 1\n" * (lint_rules.MAX_LINES + 1)
    assert findings(long, "rental/new_module.py", "module-size")
    # a module of the allow-list (each is to be split) is let through
    monkeypatch.setitem(lint_rules.MODULE_SIZE_ALLOWED, "rental/big_module.py", "to split")
    assert not findings(long, "rental/big_module.py", "module-size")
    assert not findings("x = 1\n" * lint_rules.MAX_LINES, "rental/new_module.py", "module-size")
    assert not findings(long, "tests/rental/test_big.py", "module-size")


# (f) tracker numbers

ISSUE = "issue"  # the bad snippets are built, or this file would hold what it tests for


@pytest.mark.parametrize("bad", [
    f"# see {ISSUE} 27\n", f'"""The same payment ({ISSUE}\n27)."""\n', f"x = 1  # {ISSUE.title()} #4\n",
    f"# {ISSUE}s #3 and #4\n", f"def test_the_pages_of_{ISSUE}_29():\n    pass\n",
])
def test_a_tracker_number_is_caught(bad):
    assert findings(bad, "billing/x.py", "tracker-refs")
    assert findings(bad, "tests/billing/test_x.py", "tracker-refs")


def test_words_about_issuing_pass():
    good = "from fleet.desired import _issue\ncodes_issue(user)  # issues 10 codes\nissue_count = 2\n"
    assert not findings(good, "billing/x.py", "tracker-refs")


# lock pins

def test_a_pin_the_lock_does_not_hold_is_caught(tmp_path):
    (tmp_path / "requirements").mkdir()
    (tmp_path / "pyproject.toml").write_text(
        '[project]\ndependencies = ["Django==5.2.19"]\n[project.optional-dependencies]\ntest = ["pytest==9.1.1"]\n')
    (tmp_path / "requirements" / "run.lock").write_text("django==5.2.19 \\\n    --hash=sha256:00\n")
    (tmp_path / "requirements" / "test.lock").write_text("django==5.2.19 \\\n    --hash=sha256:00\npytest==9.1.0\n")
    [finding] = lint_rules.check_lock_pins(tmp_path)
    assert "pytest==9.1.1" in finding.message and "9.1.0" in finding.message
    (tmp_path / "requirements" / "test.lock").write_text("django==5.2.19\npytest==9.1.1\n")
    assert not lint_rules.check_lock_pins(tmp_path)


def test_todays_tree_passes():
    assert lint_rules.main([]) == 0
