"""JSON bodies from the network, parsed safely: nesting deeper than MAX_DEPTH is refused
before the parser sees it, because CPython's C JSON scanner can overflow the C stack (a
segfault, not an exception) on a body of a few hundred KB of brackets."""
import json
import re

MAX_DEPTH = 32
_TOKENS = re.compile(rb'"(?:\\.|[^"\\])*"|[\[\]{}]')


def _too_deep(body: bytes) -> bool:
    # Fewer bracket bytes than MAX_DEPTH cannot nest deeper (every "[" or "{" is
    # such a byte in UTF-8, -16 and -32 alike): the usual body is decided without the scan.
    if body.count(b"[") + body.count(b"{") <= MAX_DEPTH:
        return False
    depth = 0
    for match in _TOKENS.finditer(body):
        token = match.group()
        if token in (b"[", b"{"):
            depth += 1
            if depth > MAX_DEPTH:
                return True
        elif token in (b"]", b"}"):
            depth -= 1
    return False


def parse_json(body: bytes):
    """The decoded value; ValueError for anything that is not reasonable JSON."""
    if _too_deep(body):
        raise ValueError("JSON nested too deeply")
    try:
        value = json.loads(body)
    except (UnicodeDecodeError, RecursionError) as exc:
        raise ValueError(str(exc)) from None
    # A NUL can only reach a decoded string as the escape \u0000 (a raw control byte is
    # refused by the parser): a body with neither that text nor any zero byte (as UTF-16 or
    # -32 JSON, which the parser also reads, would have) needs no walk.
    if (b"\x00" in body or b"\\u0000" in body) and _has_nul(value):
        raise ValueError("JSON holds a NUL character")
    return value


def _has_nul(value) -> bool:
    """A NUL in any key or string (an agent version, a GPU problem, an instance
    error) cannot be stored in PostgreSQL text: refused like bad JSON, never a 500."""
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_nul(v) for v in value)
    return False
