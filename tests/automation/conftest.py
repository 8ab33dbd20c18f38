"""Fixtures of the customer-channel tests: `cli` runs `gpu-rent` in process against the live
test server."""
import io
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "cli"))

from gpu_rent.main import main  # noqa: E402


@pytest.fixture
def cli(live_server, tmp_path, monkeypatch, capsys):
    """Runs `gpu-rent ARGS` in process against the live server; (exit code, stdout, stderr)."""
    monkeypatch.setenv("GPU_RENT_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.delenv("GPU_RENT_TOKEN", raising=False)
    monkeypatch.delenv("GPU_RENT_URL", raising=False)

    def run(*args, stdin: str | None = None):
        if stdin is not None:
            monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse
            code = exc.code
        out, err = capsys.readouterr()
        return code, out, err

    run.url = live_server.url
    run.config = tmp_path / "config"
    return run
