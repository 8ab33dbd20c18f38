"""Paid → container started → storefront knows → SSH, on the production path: the shipped
`gpu-node-agent` on a private dockerd against the storefront (live server, NodeAgentDriver)
with a 10-minute poll interval, so every start in seconds came by the agent's watch of its
desired state (nodeagent/PROTOCOL.md). Runs tests/nodeagent/test_paid_to_started.py with
PAID_TO_STARTED_RUNS runs (20 here, 3 in CI) and prints its distribution lines.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres .venv/bin/python bench/paid_to_started.py
    ... bench/paid_to_started.py --runs 50

Needs what tests/nodeagent needs (root, docker, iproute2, sshd: scripts/install-test-tools.sh)
and PostgreSQL (the live server and the test share the database; SQLite's in-memory one
locks under the agent's traffic)."""
import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

BASE = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    if not os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://")):
        raise SystemExit("set DATABASE_URL to a PostgreSQL server (the test database is made beside it)")
    env = {**os.environ, "PAID_TO_STARTED_RUNS": str(args.runs), "CI": "true"}
    result = subprocess.run([sys.executable, "-m", "pytest", "tests/nodeagent/test_paid_to_started.py",
                             "-p", "no:xdist", "-p", "no:cacheprovider", "-s", "-q"], cwd=BASE, env=env,
                            capture_output=True, text=True)
    lines = [line for line in result.stdout.splitlines() if re.match(r"(run \d+: )?paid -> ", line)]
    print("\n".join(lines))
    if result.returncode != 0:
        print(result.stdout[-4000:], result.stderr[-2000:], sep="\n")
        raise SystemExit(result.returncode)


if __name__ == "__main__":
    main()
