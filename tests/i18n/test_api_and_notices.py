"""API error messages follow Accept-Language while the codes stay English identifiers;
notices and e-mails are written in the customer's remembered language; sizing warnings
and the admin follow the request's language."""
from datetime import timedelta

import pytest
from django.core import mail
from django.utils import timezone

from billing.services import balance_top_up, checkout_place_order
from inventory.models import GpuSlot, Offer, Site
from ops.lifecycle import run_lifecycle
from rental.accounts.services import api_token_create
from rental.i18n import remember_language
from rental.models import CustomerSettings, Image, Notification
from tests.factories import order
from tests.i18n.catalog import CJK
from tests.rental.helpers import ED25519, call, order_body

ZH = {"HTTP_ACCEPT_LANGUAGE": "zh-Hans"}


@pytest.fixture
def token(customer):
    return api_token_create(customer=customer, name="test")[1]


def test_sold_out_message_in_chinese_code_in_english(client, catalog, other_customer, token):
    offer = Offer.objects.get(slug="8x-mi300x")
    GpuSlot.objects.filter(node__gpu_model=offer.gpu_model).exclude(node__site__code="DFW-1").update(in_service=False)
    balance_top_up(customer=other_customer, amount_cents=400_000, now=timezone.now())
    checkout_place_order(customer=other_customer, offer=offer, site=Site.objects.get(code="DFW-1"), term="week",
                         image=Image.objects.get(slug="pytorch-2.5-rocm-6.4"), ssh_public_key=ED25519,
                         pay_from_balance=True)  # an unpaid order may not take a whole SKU
    body = order_body(offer="8x-mi300x", addons={})
    zh = call(client, "post", "/api/v1/orders", token, body, **ZH).json()
    en = call(client, "post", "/api/v1/orders", token, body, HTTP_ACCEPT_LANGUAGE="en").json()
    assert zh["error"] == en["error"] == "sold_out"
    assert zh["message"] == "刚刚售罄：未产生任何扣费。" and en["message"] == "Just sold out: nothing was charged."


@pytest.mark.parametrize("path,code", [("/api/v1/leases", "unauthorized"), ("/api/v1/nope", "not_found")])
def test_auth_and_404_messages_in_chinese(client, db, path, code):
    response = client.get(path, **ZH)
    data = response.json()
    assert data["error"].isascii() and CJK.search(data["message"]), data
    if code == "not_found":
        assert data["error"] == "not_found"


def test_field_errors_in_chinese_field_names_stay(client, catalog, token):
    response = call(client, "post", "/api/v1/orders", token, order_body(ssh_key="nope"), **ZH)
    data = response.json()
    assert response.status_code == 400 and data["error"].isascii()
    assert CJK.search(str(data)), data


def test_estimate_errors_and_warnings_follow_the_language(client, catalog):
    bad = client.get("/api/v1/estimate?model=llama-2-7b&seq=abc", **ZH).json()
    assert bad == {"error": "invalid", "message": "必须是数字", "field": "seq"}
    assert client.get("/api/v1/estimate?model=llama-2-7b&seq=abc").json()["message"] == "must be a number"
    url = "/api/v1/estimate?model=llama-2-7b&method=qlora&seq=8192&checkpointing=false"
    zh = client.get(url, **ZH).json()
    en = client.get(url, HTTP_ACCEPT_LANGUAGE="en").json()
    assert any("梯度检查点未开启" in w for w in zh["warnings"]), zh["warnings"]
    assert any("Gradient checkpointing is off" in w for w in en["warnings"])
    zh_reasons = {r["reason"] for r in zh["recommendations"]}
    assert "装得下里最便宜的" in zh_reasons and all(r["mode"].isascii() for r in zh["recommendations"])


def test_notices_are_written_in_the_customers_language(catalog, customer, other_customer,
                                                       django_capture_on_commit_callbacks):
    remember_language(customer, "zh-hans")
    assert CustomerSettings.objects.get(user=customer).language == "zh-hans"
    other_customer.email = "bob@example.org"
    other_customer.save()
    t0 = timezone.now()
    for who in (customer, other_customer):
        balance_top_up(customer=who, amount_cents=6500, now=t0)
    zh_lease, _ = order(customer, t0)
    en_lease, _ = order(other_customer, t0)
    with django_capture_on_commit_callbacks(execute=True):
        run_lifecycle(t0 + timedelta(minutes=3))  # provisioned: the terms start
        run_lifecycle(t0 + timedelta(days=6, hours=1))  # reminders and renewal invoices
    zh_notes = Notification.objects.filter(lease=zh_lease)
    en_notes = Notification.objects.filter(lease=en_lease)
    assert zh_notes and en_notes
    assert all(CJK.search(n.subject) and CJK.search(n.body) for n in zh_notes), [n.subject for n in zh_notes]
    assert all(not CJK.search(n.subject) for n in en_notes)
    by = {to: [m.subject for m in mail.outbox if m.to == [to]] for to in ("alice@example.org", "bob@example.org")}
    assert by["alice@example.org"] and all(CJK.search(s) for s in by["alice@example.org"]), by
    assert by["bob@example.org"] and not any(CJK.search(s) for s in by["bob@example.org"]), by
    run_lifecycle(t0 + timedelta(days=7, minutes=4))  # unpaid: suspended (its term began at provisioning)
    suspended = Notification.objects.get(lease=zh_lease, kind="suspended")
    assert "已停机" in suspended.subject and "UTC" in suspended.body


def test_admin_follows_the_operators_language(client, operator):
    client.force_login(operator)
    zh = client.get("/admin/", **ZH)
    assert zh.status_code == 200 and "站点管理" in zh.content.decode()
    en = client.get("/admin/", HTTP_ACCEPT_LANGUAGE="en")
    assert "Site administration" in en.content.decode()
