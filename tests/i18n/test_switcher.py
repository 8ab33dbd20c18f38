"""The footer's language switcher: a plain form posting to set_language with next = this
page; the cookie remembers the choice; same URLs in both languages (no /zh-hans/ prefix)."""
from django.conf import settings
from django.urls import reverse

from rental.models import CustomerSettings
from tests.i18n.conftest import EN, ZH, assert_chinese, visible


def test_the_footer_carries_a_no_js_switcher_pointing_back_here(client, catalog):
    text = visible(client.get("/faq/?x=1", **EN))
    assert f'action="{reverse("set_language")}"' in text and 'name="next" value="/faq/?x=1"' in text
    assert '<option value="zh-hans" lang="zh-hans">简体中文</option>' in text
    assert '<option value="en" lang="en" selected>English</option>' in text
    assert '<button type="submit"' in text.split('class="lang-switch"')[1]


def test_switching_keeps_the_customer_on_the_same_page_and_is_remembered(client, catalog):
    response = client.post(reverse("set_language"), {"language": "zh-hans", "next": "/gpus/rtx-3090/"}, **EN)
    assert response.status_code == 302 and response["Location"] == "/gpus/rtx-3090/"
    cookie = response.cookies[settings.LANGUAGE_COOKIE_NAME]
    assert cookie.value == "zh-hans" and int(cookie["max-age"]) >= 300 * 24 * 3600
    page = client.get(response["Location"], **EN)  # the browser still prefers English
    assert_chinese(page, "/gpus/rtx-3090/")
    for url in ("/", "/faq/", "/size/"):  # every page after it, same URLs
        assert_chinese(client.get(url, **EN), url)
    back = client.post(reverse("set_language"), {"language": "en", "next": "/faq/"}, follow=True, **ZH)
    assert back.redirect_chain == [("/faq/", 302)] and '<html lang="en">' in visible(back)


def test_switcher_refuses_foreign_next_and_unknown_languages(client, db):
    response = client.post(reverse("set_language"), {"language": "zh-hans", "next": "https://evil.example/"})
    assert response.status_code == 302 and "evil" not in response["Location"]
    response = client.post(reverse("set_language"), {"language": "xx", "next": "/"})
    assert settings.LANGUAGE_COOKIE_NAME not in response.cookies


def test_signed_in_customers_choice_is_kept_for_notices(client, customer):
    client.force_login(customer)
    client.post(reverse("set_language"), {"language": "zh-hans", "next": "/"})
    assert CustomerSettings.objects.get(user=customer).language == "zh-hans"


def test_signup_in_chinese_remembers_chinese(client, db):
    client.post(reverse("signup"), {"username": "li", "password1": "correct horse battery 9",
                                    "password2": "correct horse battery 9"}, **ZH)
    assert CustomerSettings.objects.get(user__username="li").language == "zh-hans"


def test_first_visit_follows_accept_language_and_urls_are_the_same(client, catalog):
    assert '<html lang="zh-hans">' in visible(client.get("/gpus/", **ZH))
    assert '<html lang="en">' in visible(client.get("/gpus/", **EN))
    assert client.get("/zh-hans/gpus/", **ZH).status_code == 404  # no language prefix
