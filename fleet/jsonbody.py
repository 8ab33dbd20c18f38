"""JSON bodies from the network, parsed safely: nesting deeper than MAX_DEPTH is refused
before the parser sees it, because CPython's C JSON scanner can overflow the C stack (a
segfault, not an exception) on a body of a few hundred KB of brackets."""
import json
import re

MAX_DEPTH = 32
_TOKENS = re.compile(rb'"(?:\\.|[^"\\])*"|[\[\]{}]')


def _too_deep(body: bytes) -> bool:
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
        return json.loads(body)
    except (UnicodeDecodeError, RecursionError) as exc:
        raise ValueError(str(exc)) from None
