"""Every customer page in English and Simplified Chinese: chosen by Accept-Language on a
first visit and by the switcher's cookie afterwards; on the Chinese page there is Chinese
and no English UI string from the catalog is left untranslated."""
import re

import pytest
from django.conf import settings
from django.urls import reverse

from tests.i18n.conftest import EN, ZH, assert_chinese, visible
from tests.i18n.helpers import PUBLIC, customer_urls

CUSTOMER = ["order", "lease_list", "lease_detail", "invoices", "invoice", "balance", "account_settings",
            "password_change", "pay", "quote", "sla_claims"]
QUERIES = [
    # the calculator with warnings, advice and the training-time section
    "/size/?model=llama-2-7b&method=qlora&seq=8192&checkpointing=off&tokens=20000000",
    "/size/?model=llama-2-70b&method=full&gpus=8&zero=3&offload=optimizer&vendor=any",
    "/size/?params=900&method=full",  # nothing fits: cluster advice
    "/size/?model=llama-2-70b&method=lora",  # plan headline, one-change plans, overbuy on the row
    "/size/?model=mixtral-8x7b&method=qlora&seq=40000&checkpointing=off&framework=torchtune",  # MoE, loss
    "/size/?seq=abc&gpus=99",  # form errors
    "/gpus/?vram_min=48&in_stock=on",
]


@pytest.mark.parametrize("name,args", PUBLIC)
def test_public_pages_in_chinese_by_accept_language(client, catalog, name, args):
    url = reverse(name, args=args)
    response = client.get(url, **ZH)
    assert response.status_code == 200, url
    assert_chinese(response, url)
    assert "Accept-Language" in response.get("Vary", "")


@pytest.mark.parametrize("name,args", PUBLIC)
def test_public_pages_in_chinese_by_the_cookie_whatever_the_browser_says(client, catalog, name, args):
    client.cookies[settings.LANGUAGE_COOKIE_NAME] = "zh-hans"
    url = reverse(name, args=args)
    response = client.get(url, **EN)
    assert response.status_code == 200, url
    assert_chinese(response, url)


@pytest.mark.parametrize("name,args", PUBLIC)
def test_public_pages_in_english(client, catalog, name, args):
    response = client.get(reverse(name, args=args), **EN)
    text = visible(response)
    assert response.status_code == 200 and '<html lang="en">' in text
    assert "Dedicated GPUs by the week or the month." in text


@pytest.mark.parametrize("url", QUERIES)
def test_calculator_results_errors_and_filters_in_chinese(client, catalog, url):
    response = client.get(url, **ZH)
    assert response.status_code in (200, 400), url
    assert_chinese(response, url)


def test_calculator_fragment_in_chinese(client, catalog):
    response = client.get(QUERIES[0], HTTP_HX_REQUEST="true", **ZH)
    text = visible(response)
    assert response.status_code == 200 and "梯度检查点未开启" in text and "推荐" in text


def test_customer_pages_in_chinese(client, shop):
    for name, url in customer_urls(shop).items():
        response = client.get(url, **ZH)
        assert response.status_code == 200, (name, url, response.status_code)
        assert_chinese(response, url)


def test_customer_pages_in_chinese_by_cookie(client, shop):
    client.cookies[settings.LANGUAGE_COOKIE_NAME] = "zh-hans"
    for url in customer_urls(shop).values():
        assert_chinese(client.get(url, **EN), url)


def test_customer_pages_in_english(client, shop):
    for name, url in customer_urls(shop).items():
        response = client.get(url, **EN)
        assert response.status_code == 200 and '<html lang="en">' in visible(response), name


def test_form_errors_in_chinese(client, catalog):
    response = client.post(reverse("signup"), {"username": "x", "password1": "a", "password2": "b"}, **ZH)
    assert response.status_code == 400
    assert_chinese(response, "signup POST")


def test_order_form_errors_in_chinese(client, shop):
    response = client.post(reverse("order", args=["rtx-3090"]), {"site": "NOPE", "ssh_public_key": "nope"}, **ZH)
    assert response.status_code == 400
    text = visible(response)
    assert_chinese(response, "order POST")
    assert "不支持的公钥类型" in text


def test_times_are_24_hour_utc_with_the_zone_and_money_keeps_dollars(client, shop):
    text = visible(client.get(reverse("billing:invoice", args=[shop["invoice"].pk]), **ZH))
    assert f"{shop['invoice'].created_at:%Y-%m-%d %H:%M} UTC" in text
    assert "$" in text and "¥" not in text and "￥" not in text
    lease = visible(client.get(reverse("lease_detail", args=[shop["lease"].pk]), **ZH))
    assert f"{shop['lease'].created_at:%Y-%m-%d %H:%M} UTC" in lease
    assert not re.search(r"\b\d{1,2}:\d{2}\s?(AM|PM|a\.m\.|p\.m\.)", lease)  # no 12-hour clock


def test_thousands_are_grouped_in_both_languages(client, catalog):
    for lang in (EN, ZH):
        text = visible(client.get(reverse("catalog"), **lang))
        assert "$1,690" in text and "$12,170" in text
