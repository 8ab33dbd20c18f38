"""A desired item's customer fields (env, start command, registry credentials, sizes),
checked before anything about the instance changes; a bad one fails the lease with
`bad_desired_state` and names the field (or the variable), never a value."""
import re

from .interfaces import OperationFailed

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
MAX_START_COMMAND = 4096


def environment(raw) -> tuple[tuple[str, str], ...]:
    """The item's `env` as sorted pairs; a bad one names the variable, never its value."""
    if raw in (None, {}):
        return ()
    if not isinstance(raw, dict):
        raise OperationFailed("bad_desired_state", "env must be an object of strings")
    for name, value in raw.items():
        if not isinstance(name, str) or not ENV_NAME.fullmatch(name):
            raise OperationFailed("bad_desired_state", f"env: {str(name)[:64]!r} is not a variable name")
        if not isinstance(value, str) or "\0" in value:
            raise OperationFailed("bad_desired_state", f"env: the value of {name} is not a string")
    return tuple(sorted(raw.items()))


def start_command(raw) -> str:
    if raw in (None, ""):
        return ""
    if not isinstance(raw, str) or "\0" in raw or len(raw) > MAX_START_COMMAND:
        raise OperationFailed("bad_desired_state",
                              f"start_command must be a string of at most {MAX_START_COMMAND} characters")
    return raw


def registry_auth(raw) -> dict | None:
    if raw in (None, {}):
        return None
    if not isinstance(raw, dict) or not all(isinstance(raw.get(k, ""), str)
                                            for k in ("server", "username", "password")):
        raise OperationFailed("bad_desired_state", "registry_auth must hold server, username "
                              "and password strings")
    return {k: raw.get(k, "") for k in ("server", "username", "password")}


def non_negative(raw, name: str) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
        raise OperationFailed("bad_desired_state", f"{name} must be a whole number of bytes")
    return raw
