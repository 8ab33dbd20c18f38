"""Read the zh_Hans catalog without polib: msgids and msgstrs straight from the .po."""
import ast
import re
from functools import cache
from pathlib import Path

from django.conf import settings

PO = Path(settings.BASE_DIR) / "locale" / "zh_Hans" / "LC_MESSAGES" / "django.po"
MO = PO.with_suffix(".mo")
CJK = re.compile(r"[\u4e00-\u9fff]")
_KEY = re.compile(r'^(msgctxt|msgid_plural|msgid|msgstr(?:\[\d+\])?) (".*")$')


def parse(path: Path) -> list[dict]:
    """Entries as {"msgid", "msgid_plural", "msgstr": [..], "flags": set}; the header included."""
    entries, cur, key = [], None, None
    for line in path.read_text(encoding="utf-8").splitlines() + [""]:
        line = line.strip()
        if not line:
            if cur is not None:
                entries.append(cur)
            cur, key = None, None
            continue
        if cur is None:
            cur = {"msgid": "", "msgid_plural": None, "msgctxt": None, "msgstr": [], "flags": set()}
        if line.startswith("#,"):
            cur["flags"] |= {f.strip() for f in line[2:].split(",")}
        elif line.startswith("#"):
            continue
        elif m := _KEY.match(line):
            key, text = m.group(1), ast.literal_eval(m.group(2))
            if key.startswith("msgstr"):
                cur["msgstr"].append(text)
                key = ("msgstr", len(cur["msgstr"]) - 1)
            else:
                cur[key] = text
        elif line.startswith('"'):
            text = ast.literal_eval(line)
            if isinstance(key, tuple):
                cur["msgstr"][key[1]] += text
            else:
                cur[key] = (cur[key] or "") + text
    return entries


@cache
def messages() -> tuple[dict, ...]:
    return tuple(e for e in parse(PO) if e["msgid"])


def _placeholder_free(msgid: str) -> bool:
    return "%" not in msgid and "<" not in msgid and "{" not in msgid


@cache
def english_ui_strings() -> tuple[str, ...]:
    """Catalog strings that must never show up verbatim on a Chinese page: three words or
    more, no placeholders, and a translation that differs from the English."""
    out = []
    for e in messages():
        msgid = e["msgid"]
        if len(msgid.split()) >= 3 and _placeholder_free(msgid) and e["msgstr"] and e["msgstr"][0] != msgid:
            out.append(msgid)
    return tuple(out)
