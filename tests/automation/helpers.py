"""Shared by the extension, CLI and webhook tests: an active lease bought from the balance, API calls,
the CLI's login, the environment of a CLI subprocess."""
import json
import os
from datetime import timedelta
from pathlib import Path

from billing.services import balance_top_up, checkout_place_order
from inventory.models import Offer, Site
from ops.lifecycle import run_lifecycle
from rental.accounts.services import api_token_create
from rental.models import Image, Lease, LeaseState

ROOT = Path(__file__).resolve().parents[2]
CLI_DIR = ROOT / "cli"  # the client's sources (tests/automation/conftest.py puts them on sys.path)
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGq4Yg3Yd6n3Zl9k1X2J0m3w9mRrV0Xq8bX9bUZf3m1P alice@laptop"
WEEK = timedelta(days=7)


def active_lease(customer, t0, *, balance_cents=6500, offer="rtx-3090", term="week") -> Lease:
    """Ordered and paid from the balance at t0, ready (FakeAgent) 3 minutes later."""
    balance_top_up(customer=customer, amount_cents=balance_cents + Offer.objects.get(slug=offer).weekly_cents * 5,
                   now=t0)
    lease, _invoice = checkout_place_order(
        customer=customer, offer=Offer.objects.get(slug=offer), site=Site.objects.get(code="DFW-1"), term=term,
        image=Image.objects.get(slug="pytorch-2.5-cuda-12.4"), ssh_public_key=KEY, pay_from_balance=True, now=t0)
    run_lifecycle(t0 + timedelta(minutes=3))
    lease.refresh_from_db()
    assert lease.state == LeaseState.ACTIVE
    return lease


def drain_balance(customer, t0) -> None:
    from billing.models import LedgerEntry
    from billing.services import account_for, ledger_post

    left = account_for(customer).balance_cents
    if left:
        ledger_post(customer=customer, kind=LedgerEntry.Kind.ADJUSTMENT, amount_cents=-left, now=t0, memo="test")


def call(client, method, url, token=None, body=None):
    extra = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}
    data = json.dumps(body) if body is not None else ""
    return getattr(client, method)(url, data=data, content_type="application/json", **extra)


def login(cli, customer, scopes=("read", "order", "manage", "pay")):
    token = api_token_create(customer=customer, name="cli", scopes=scopes)[1]
    code, out, err = cli("login", "--url", cli.url, "--token-stdin", stdin=token + "\n")
    assert code == 0, err
    return token


def _subprocess_env(cli, **extra):
    return {**os.environ, "GPU_RENT_CONFIG_DIR": str(cli.config), "PYTHONPATH": str(CLI_DIR), **extra}
