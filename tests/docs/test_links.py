"""Every relative link in the repository's Markdown files resolves: the file or folder exists,
inside the repository, and a `#fragment` names a heading of the Markdown file it points at.
Links to the web (http, https, mailto) are not fetched. Pure text; no Django, no database."""
import os
import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SKIP_DIRS = {".git", ".venv", "node_modules", "var", "mutants", "__pycache__", ".pytest_cache",
             ".hypothesis", ".ruff_cache", "shared"}
FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"`+[^`]*`+")
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
HEADING = re.compile(r"^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$")
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # http:, https:, mailto:, …


def markdown_files() -> list[Path]:
    found = []
    for folder, dirs, files in os.walk(ROOT):  # pruned: .venv and var are never walked
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS]
        found += [Path(folder) / name for name in files if name.endswith(".md")]
    return sorted(found)


def prose_lines(path: Path, *, strip_code: bool = True):
    """(line number, text) outside fenced code blocks, inline code spans removed unless told."""
    fenced = False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield number, INLINE_CODE.sub("", line) if strip_code else line


def links(path: Path):
    for number, line in prose_lines(path):
        for match in (*INLINE_LINK.finditer(line), *filter(None, [REFERENCE.match(line)])):
            yield number, match.group(1)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces to '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    text = text.replace("`", "").strip().lower()
    text = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN")
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    result = set()
    for _number, line in prose_lines(path, strip_code=False):
        match = HEADING.match(line)
        if match:
            base = slug(match.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            result.add(base if count == 0 else f"{base}-{count}")
    return result


def broken_links(path: Path) -> list[str]:
    problems = []
    for number, target in links(path):
        if EXTERNAL.match(target):
            continue
        where = f"{path.relative_to(ROOT)}:{number}: {target}"
        file_part, _, fragment = target.partition("#")
        if file_part.startswith("/"):
            problems.append(f"{where} (absolute path: link relative to the file instead)")
            continue
        resolved = (path.parent / file_part).resolve() if file_part else path
        try:
            resolved.relative_to(ROOT)
        except ValueError:
            problems.append(f"{where} (outside the repository)")
            continue
        if not resolved.exists():
            problems.append(f"{where} (no such file)")
            continue
        if fragment and resolved.suffix == ".md" and fragment.lower() not in anchors(resolved):
            problems.append(f"{where} (no heading #{fragment} in {resolved.relative_to(ROOT)})")
    return problems


def test_the_checker_sees_links_and_headings_as_github_does(tmp_path):
    doc = tmp_path / "a.md"
    doc.write_text("# Fleet scale (`bench/fleet.py`)\n## Fleet scale (`bench/fleet.py`)\n"
                   "[x](b.md#part-two) `[not](a link)` [y][ref]\n```\n[nor](this)\n```\n[ref]: c.md\n")
    assert anchors(doc) == {"fleet-scale-benchfleetpy", "fleet-scale-benchfleetpy-1"}
    assert [t for _n, t in links(doc)] == ["b.md#part-two", "c.md"]
    assert slug("3. Two storefront hosts") == "3-two-storefront-hosts"


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves_inside_the_repository(path):
    problems = broken_links(path)
    assert not problems, "broken links:\n" + "\n".join(problems)
