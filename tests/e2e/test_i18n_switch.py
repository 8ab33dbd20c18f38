"""In a real browser: a first visit follows the browser's language, the footer switcher
changes the language and keeps the customer on the same page (query string included), and
the choice sticks across pages and visits."""
import re


def test_switch_language_and_stay_on_the_same_page(new_context):
    page = new_context(locale="en-US").new_page()
    page.goto("/gpus/rtx-3090/?from=test")
    assert page.locator("html").get_attribute("lang") == "en"
    assert "Card-to-card link" in page.locator("main").inner_text()

    page.select_option("#lang-select", "zh-hans")
    page.locator("form.lang-switch button[type=submit]").click()
    page.wait_for_load_state()
    assert page.url.endswith("/gpus/rtx-3090/?from=test")
    assert page.locator("html").get_attribute("lang") == "zh-hans"
    assert "卡间互联" in page.locator("main").inner_text()
    assert page.locator("#lang-select").input_value() == "zh-hans"

    page.goto("/gpus/")  # remembered on the next page, same URLs; prices grouped, in dollars
    assert "GPU 与价格" in page.locator("main").inner_text()
    assert re.search(r"\$1,\d{3}", page.locator("main").inner_text())
    page.goto("/faq/")
    assert "客户常问的问题" in page.locator("main").inner_text()

    page.select_option("#lang-select", "en")
    page.locator("form.lang-switch button[type=submit]").click()
    page.wait_for_load_state()
    assert page.url.endswith("/faq/") and page.locator("html").get_attribute("lang") == "en"


def test_first_visit_follows_the_browser_language(new_context):
    page = new_context(locale="zh-CN", extra_http_headers={"Accept-Language": "zh-Hans,zh;q=0.9"}).new_page()
    page.goto("/")
    assert page.locator("html").get_attribute("lang") == "zh-hans"
    assert "微调" in page.locator("main").inner_text()
