"""Tests that need an outside tool (chromium, gettext, litecoind, monerod, anvil, docker,
cryptsetup, qemu, …) call `require_tool` / `require`. Locally a missing tool skips the
test with the reason; with CI=true it fails it, so CI can never pass by skipping."""
import os
import shutil

import pytest

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def require(condition: bool, reason: str) -> None:
    """Skip (locally) or fail (CI=true) the calling test unless `condition` holds."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"CI=true and a required tool is missing: {reason}", pytrace=False)
    pytest.skip(reason)


def require_tool(name: str, hint: str = "") -> str:
    """The path of executable `name`; skip or fail (CI) when it is not installed."""
    path = shutil.which(name)
    require(path is not None, f"{name} is not installed{f' ({hint})' if hint else ''}")
    return path
