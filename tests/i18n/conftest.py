import html
import re

import pytest

from tests.i18n.catalog import CJK, english_ui_strings

ZH = {"HTTP_ACCEPT_LANGUAGE": "zh-Hans,zh;q=0.9,en;q=0.5"}
EN = {"HTTP_ACCEPT_LANGUAGE": "en-US,en;q=0.9"}


def visible(response) -> str:
    """The page as a reader (and a screen reader) gets it: markup kept, entities decoded."""
    return html.unescape(response.content.decode())


def assert_chinese(response, url=""):
    text = visible(response)
    assert '<html lang="zh-hans">' in text, url
    assert len(CJK.findall(re.sub(r"<[^>]+>", " ", text))) >= 10, f"{url}: hardly any Chinese"
    left = [s for s in english_ui_strings() if s in text]
    assert not left, f"{url}: English UI strings left on the Chinese page: {left}"


@pytest.fixture(autouse=True)
def _english_default(settings):
    settings.LANGUAGE_CODE = "en"
