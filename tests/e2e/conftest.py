"""Browser tests: Playwright for Python driving Debian's chromium against pytest-django's
live_server. Skipped (with the reason) when /usr/bin/chromium or Playwright is missing,
failed under CI=true (tests/tools.py).

Playwright's sync API runs an asyncio loop in the test thread, so Django's async-safety
check would refuse the test's own ORM calls: DJANGO_ALLOW_ASYNC_UNSAFE is set for this
package only (the live server runs in its own thread, unaffected)."""
import os
from pathlib import Path

import pytest

from tests import deadlines
from tests.tools import require

os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
SCREENSHOTS = Path(__file__).parent / "screenshots"
DESKTOP = {"width": 1280, "height": 900}
PHONE = {"width": 390, "height": 844}
PASSWORD = "correct horse battery 9"


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def browser():
    require(os.path.exists(CHROMIUM), f"{CHROMIUM} is not installed (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        require(False, "Playwright for Python is not installed (make setup)")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def shop(transactional_db, live_server, settings):
    """The demo catalog and images in the live server's database; provisioning completes on
    the next lifecycle pass."""
    from inventory.demo import load_demo_catalog
    from rental.demo import load_demo_images

    settings.HOST_AGENT_FAKE_DELAY = 0
    load_demo_catalog()
    load_demo_images()
    return live_server.url


@pytest.fixture
def new_context(browser, shop):
    contexts = []

    def make(viewport=DESKTOP, **kwargs):
        ctx = browser.new_context(base_url=shop, viewport=viewport, **kwargs)
        ctx.set_default_timeout(ms(10))
        contexts.append(ctx)
        return ctx

    yield make
    for ctx in contexts:
        ctx.close()


def ms(seconds: float) -> float:
    """Playwright's timeouts are milliseconds: `seconds` unloaded, scaled by the load now."""
    return deadlines.scaled(seconds) * 1000


def login(page, username, password=PASSWORD):
    page.goto("/accounts/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.locator("main form button[type=submit]").click()
    page.wait_for_load_state()
    assert "/accounts/login/" not in page.url, page.locator("main").inner_text()


def screenshot(page, name):
    SCREENSHOTS.mkdir(exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)
