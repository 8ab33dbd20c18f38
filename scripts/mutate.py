#!/usr/bin/env python3
"""`make mutate`: mutmut over the rule modules, one module at a time.

Each module has its own source paths and the test files that cover it (MODULES below: the files
under the sources' mirrors in tests/, plus the ones each names), and
runs in its own work directory, var/mutate/<module>/: a pyproject.toml that is the project's
with `[tool.mutmut]` replaced by the module's selection, the project's top-level entries as
symlinks, and mutmut's `mutants/` (so each module keeps its own cached results, and a change
to one module's test selection does not reset the others'). A mutant's pytest session builds
its SQLite test database from the models (`--nomigrations`: the only data migration,
billing 0011, backfills existing rows and is a no-op on an empty database) instead of
replaying 44 migrations, which took most of each mutant's wall time.

    scripts/mutate.py                      every module, then the table
    scripts/mutate.py sizing rules         only these modules
    scripts/mutate.py --list               the modules, their sources and tests
    scripts/mutate.py --table [MODULE…]    the table from the stored results (no run)
    scripts/mutate.py --survivors MODULE   each survivor's diff (mutmut show)
    scripts/mutate.py --max-children 1 …   fewer parallel mutants (default: 2)
    scripts/mutate.py payments --only 'billing.payments.quotes.x_required_confirmations*'
                                           only the mutants of these functions (mutmut's names)

`MUTATE_NICE` (default 19) is the niceness the mutmut processes run at.
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "var" / "mutate"

@dataclass(frozen=True)
class Module:
    """What one mutmut run mutates, and which tests judge it.

    The tests come from the paths: a source file `app/pkg/mod.py` is covered by the test files
    under `tests/app/pkg/mod/`, a source package `app/pkg/` by those under `tests/app/pkg/`
    (the layout rule of CONTRIBUTING.md). `also` names the test files elsewhere that exercise the
    module through another one (a lifecycle pass through the rules, a page through a service).
    Tests that drive real daemons or infrastructure (the `daemons` and `infra` markers) are
    deselected: they cannot run per mutant."""
    sources: tuple[str, ...]
    excluded: tuple[str, ...] = ()
    also: tuple[str, ...] = ()

    def mirrors(self) -> list[str]:
        return [mirror_of(src) for src in self.sources]

    def tests(self) -> list[str]:
        found: list[str] = []
        for place in self.mirrors():
            found += sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / place).rglob("test_*.py"))
        return found + [t for t in self.also if t not in found]


def mirror_of(source: str) -> str:
    """`billing/ledger.py` -> `tests/billing/ledger`; `billing/payments/` -> `tests/billing/payments`."""
    return "tests/" + source.rstrip("/").removesuffix(".py")


MODULES: dict[str, Module] = {
    "sizing": Module(("sizing/engine.py",), also=(
        "tests/sizing/recommend/test_plain_plans.py", "tests/sizing/recommend/test_card_choices.py",
        "tests/sizing/inputs/test_errors_name_the_field.py",
        "tests/sizing/test_agrees.py",  # the tables page, the FAQ and the calculator on one set of figures
    )),
    "rules": Module(("rental/rules.py",), also=(
        "tests/fleet/test_lifecycle_contract.py", "tests/ops/lifecycle/test_end_to_end.py",
        "tests/ops/lifecycle/test_edges.py",
    )),
    "inventory": Module(("inventory/services.py",), also=(
        "tests/ops/lifecycle/test_races.py", "tests/fleet/test_burn_in.py",
        "tests/experience/test_operator_day.py",  # the node admin: node_save, draining
    )),
    # the payment rules: what a quote asks for, what a payment is worth and when it counts, what is
    # credited, taken back after a reorg (reversals), used late, or reported in the wrong coin; the
    # rate a quote may lock (pricing, and coins/rates.py's staleness and price guard); base units and
    # cents (coins/amounts.py); the block walker's reorg detection (coins/walker.py, tested against
    # an in-memory chain). Not mutated: the chain adapters (coins/evm.py, utxo.py, monero.py,
    # solana.py: JSON-RPC against the chain nodes) and the key/address derivation (coins/keys.py,
    # addresses.py) are I/O and encodings tested against real daemons, minutes per session, which
    # cannot run per mutant; coins/registry.py, base.py, config.py read settings and wire adapters
    # (the rules' values are settings, read by the tests); selectors.py, views.py, admin.py,
    # urls.py are presentation; health.py (a watcher's liveness) and demo.py / coins/demo.py (the
    # demo store's fake coin) decide no money.
    "payments": Module(("billing/payments/",), excluded=tuple(f"billing/payments/{f}" for f in (
        "__init__.py", "addresses.py", "admin.py", "config.py", "demo.py", "health.py", "selectors.py",
        "urls.py", "views.py", "coins/__init__.py", "coins/base.py", "coins/demo.py", "coins/evm.py",
        "coins/keys.py", "coins/monero.py", "coins/registry.py", "coins/solana.py", "coins/utxo.py",
    )), also=(
        "tests/ops/lifecycle/test_payment_sweeps.py",  # the quote expiry sweep and the order's hold
    )),
    "billing": Module(("billing/services.py", "billing/refunds.py", "billing/renewals.py"), also=(
        "tests/ops/lifecycle/test_end_to_end.py", "tests/ops/lifecycle/test_edges.py",
        "tests/billing/test_money_property.py", "tests/billing/payments/test_reversals.py",
        "tests/billing/views/test_order_invoice_and_balance_pages.py", "tests/storage/test_my_storage_page.py",
        "tests/fleet/test_lifecycle_contract.py",
        "tests/security/test_refund_limit.py",  # refunds_left: REFUNDS_PER_MONTH
        "tests/ops/test_ordered_volume_edges.py",  # _lease_refund_claim: a pending add-on refunded first
        "tests/security/test_hoarding.py", "tests/automation/test_extension.py", "tests/rental/test_admin.py",
    )),
    # the balance itself: postings under the account lock, idempotency, the refusal to go below
    # zero, batches with refused="skip", top-ups, what is left to refund of an invoice
    "ledger": Module(("billing/ledger.py",), also=(
        "tests/billing/test_money_property.py", "tests/billing/refunds/test_refunds.py",
        "tests/billing/refunds/test_rules.py", "tests/billing/renewals/test_batch_writes_what_single_leases_write.py",
        "tests/security/test_refund_limit.py", "tests/ops/test_ordered_volume_edges.py",
        "tests/ops/test_ledger_revenue.py", "tests/rental/test_api.py",
    )),
    "fleet-desired": Module(("fleet/desired.py",), also=(
        "tests/fleet/test_lifecycle.py", "tests/fleet/test_lifecycle_contract.py", "tests/fleet/test_trust.py",
        "tests/fleet/test_node_state.py",  # a migration: the old node is told absent / destroy_key
        "tests/fleet/test_pages.py",  # the customer's stop / start / restart
        "tests/fleet/test_desired_version.py",  # the clock that ends a document's validator
        "tests/fleet/test_burn_in.py",  # the document's burn_in list
    )),
    # not tests/storage's snapshot files: they start a Ceph cluster, dockerd and restic per session
    # (infra); evidence/test_rules.py sends their snapshot records on SQLite
    "fleet-evidence": Module(("fleet/evidence.py",), also=(
        "tests/fleet/test_sanitization_record.py", "tests/fleet/test_lifecycle.py",
        "tests/fleet/test_lifecycle_contract.py", "tests/fleet/test_node_state.py",
        "tests/fleet/test_report_bounds.py", "tests/fleet/test_bad_input.py", "tests/fleet/test_trust.py",
    )),
}

# Never linked into a work directory: mutmut's own output, caches, the virtualenvs.
SKIP = {".git", "var", "mutants", ".venv", ".mvenv", ".pytest_cache", ".ruff_cache", ".hypothesis",
        "pyproject.toml", "node_modules", ".chain-tools"}

STATUS = {1: "killed", 3: "killed", 0: "survived", 5: "no tests", 33: "no tests", 34: "skipped",
          36: "timeout", -24: "timeout", 24: "timeout", 152: "timeout", 255: "timeout", None: "not checked",
          37: "type check", -11: "segfault", -9: "segfault"}


def workdir(module: str) -> Path:
    spec = MODULES[module]
    wd = WORK / module
    wd.mkdir(parents=True, exist_ok=True)
    for entry in ROOT.iterdir():
        if entry.name in SKIP:
            continue
        link = wd / entry.name
        if not link.is_symlink():
            link.symlink_to(entry)
    also_copy = sorted(e.name + ("/" if e.is_dir() else "") for e in ROOT.iterdir()
                       if e.name not in SKIP and not e.name.startswith(".") and e.name != "docs")
    pyproject = (ROOT / "pyproject.toml").read_text()
    # the project's [tool.mutmut] (and the comment block above it) gives way to this module's
    pyproject = re.sub(r"(?ms)^\[tool\.mutmut\].*?(?=^\[)", "", pyproject)
    section = {
        "source_paths": list(spec.sources),
        "do_not_mutate": list(spec.excluded),
        "pytest_add_cli_args_test_selection": spec.tests(),
        "also_copy": also_copy,
        "pytest_add_cli_args": ["-p", "no:xdist", "-p", "no:cacheprovider", "--nomigrations",
                                "-m", "not daemons and not infra and not node_box"],
        "timeout_constant": 30.0,
        "timeout_multiplier": 3.0,
    }
    body = "\n".join(f"{k} = {json.dumps(v)}" for k, v in section.items())
    text = pyproject.rstrip() + f"\n\n# generated by scripts/mutate.py for module {module!r}\n[tool.mutmut]\n{body}\n"
    target = wd / "pyproject.toml"
    if not target.exists() or target.read_text() != text:
        target.write_text(text)
    return wd


def unmutated(module: str) -> list[str]:
    """The functions of a module's sources that mutmut 3.8 never mutates: every decorated one
    (other than a lone @staticmethod/@classmethod; its trampoline would re-run the decorator).
    The rule services open `with transaction.atomic():` in their body for this reason."""
    spec = MODULES[module]
    files = []
    for src in spec.sources:
        path = ROOT / src
        files += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    skipped = []
    for path in files:
        rel = path.relative_to(ROOT).as_posix()
        if rel in spec.excluded:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or not node.decorator_list:
                continue
            names = [ast.unparse(d) for d in node.decorator_list]
            if names not in (["staticmethod"], ["classmethod"]):
                skipped.append(f"{rel}:{node.lineno} {node.name} (@{', @'.join(names)})")
    return skipped


def counts(module: str) -> tuple[Counter, list[str]]:
    meta_root = WORK / module / "mutants"
    c: Counter = Counter()
    survivors = []
    for meta in sorted(meta_root.rglob("*.py.meta")):
        data = json.loads(meta.read_text())
        for key, code in data.get("exit_code_by_key", {}).items():
            status = STATUS.get(code, "suspicious")
            c[status] += 1
            if status not in ("killed",):
                survivors.append(f"{key}: {status}")
    return c, survivors


def table(modules: list[str], walls: dict[str, float]) -> str:
    rows = ["| module | sources | mutants | killed | survived | timeout | other | wall |",
            "|---|---|---:|---:|---:|---:|---:|---:|"]
    for m in modules:
        c, _ = counts(m)
        total = sum(c.values())
        other = total - c["killed"] - c["survived"] - c["timeout"]
        wall = walls.get(m)
        rows.append(f"| {m} | {', '.join(MODULES[m].sources)} | {total} | {c['killed']} | {c['survived']} | "
                    f"{c['timeout']} | {other} | {f'{wall / 60:.1f} min' if wall else '–'} |")
    return "\n".join(rows)


def mutmut(module: str, *args: str) -> int:
    wd = workdir(module)
    nice = os.environ.get("MUTATE_NICE", "19")
    cmd = ["nice", "-n", nice, sys.executable, "-m", "mutmut", *args]
    env = dict(os.environ)
    env.pop("CI", None)  # a missing tool should skip here, not fail the stats run
    return subprocess.call(cmd, cwd=wd, env=env)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("modules", nargs="*", help=f"default: all of {', '.join(MODULES)}")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--table", action="store_true")
    ap.add_argument("--survivors", action="store_true")
    ap.add_argument("--max-children", default="2")
    ap.add_argument("--only", nargs="+", default=[], metavar="GLOB", help="mutant names (fnmatch) to run")
    a = ap.parse_args()
    unknown = [m for m in a.modules if m not in MODULES]
    if unknown:
        ap.error(f"unknown module(s) {unknown}; known: {', '.join(MODULES)}")
    modules = a.modules or list(MODULES)
    if a.list:
        for m in modules:
            spec = MODULES[m]
            print(f"{m}: {' '.join(spec.sources)}" + (f" (not {' '.join(spec.excluded)})" if spec.excluded else ""))
            print("    " + "\n    ".join(spec.tests()))
            for line in unmutated(m):
                print(f"    not mutated (decorated): {line}")
        return 0
    if a.table:
        print(table(modules, {}))
        return 0
    if a.survivors:
        for m in modules:
            _, left = counts(m)
            for line in left:
                print(f"## {m} {line}")
                mutmut(m, "show", line.split(":")[0])
        return 0
    walls = {}
    for m in modules:
        print(f"== mutmut: {m} ({' '.join(MODULES[m].sources)})", flush=True)
        for line in unmutated(m):
            print(f"   not mutated (decorated): {line}", flush=True)
        start = time.monotonic()
        rc = mutmut(m, "run", "--max-children", a.max_children, *a.only)
        walls[m] = time.monotonic() - start
        if rc:
            print(f"mutmut run for {m} exited {rc}", flush=True)
        _, left = counts(m)
        print(f"-- {m}: not killed:\n    " + "\n    ".join(left or ["none"]), flush=True)
    print(table(modules, walls))
    return 0


if __name__ == "__main__":
    sys.exit(main())
