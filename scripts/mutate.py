#!/usr/bin/env python3
"""`make mutate`: mutmut over the rule modules, one module at a time.

Each module has its own source paths and the test files that cover it (MODULES below), and
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
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "var" / "mutate"

# module: (source paths to mutate, files in them not to mutate, test files that cover them)
MODULES: dict[str, tuple[list[str], list[str], list[str]]] = {
    "sizing": (["sizing/engine.py"], [], [
        "tests/sizing/test_terms.py", "tests/sizing/test_engine.py", "tests/sizing/test_families.py",
        "tests/sizing/test_properties.py", "tests/sizing/test_plain.py", "tests/sizing/test_agrees.py",
        "tests/sizing/test_recommend.py", "tests/sizing/test_inputs.py", "tests/sizing/test_measured.py",
    ]),
    "rules": (["rental/rules.py"], [], [
        "tests/rental/test_rules_shown.py", "tests/fleet/test_lifecycle_contract.py",
        "tests/billing/test_lifecycle.py", "tests/billing/test_lifecycle_edges.py",
    ]),
    "inventory": (["inventory/services.py"], [], [
        "tests/inventory/test_catalog.py", "tests/inventory/test_last_gpu_sqlite.py",
        "tests/billing/test_concurrency.py", "tests/fleet/test_burn_in.py",
        "tests/experience/test_operator_day.py",  # the node admin: node_save, draining
    ]),
    # the payment rules: what a quote asks for, what a payment is worth and when it counts, what is
    # credited, taken back after a reorg (reversals), used late, or reported in the wrong coin; the
    # rate a quote may lock (pricing, and coins/rates.py's staleness and price guard); base units and
    # cents (coins/amounts.py); the block walker's reorg detection (coins/walker.py, tested against
    # an in-memory chain)
    "payments": ([
        "billing/payments/services.py", "billing/payments/quotes.py", "billing/payments/credits.py",
        "billing/payments/reversals.py", "billing/payments/late.py", "billing/payments/misdirected.py",
        "billing/payments/pricing.py", "billing/payments/coins/amounts.py", "billing/payments/coins/walker.py",
        "billing/payments/coins/rates.py",
    ], [], [
        "tests/billing/test_confirmations.py", "tests/billing/test_payments.py",
        "tests/billing/test_payments_holes.py", "tests/billing/test_payments_ops.py",
        "tests/billing/test_payments_concurrency.py", "tests/billing/test_money_reversals.py",
        "tests/billing/test_price_sources.py", "tests/billing/coins/test_units.py",
        # session 12: the walker over an in-memory chain, the rate sources against a local server,
        # and the rules the first complete run found untested
        "tests/billing/coins/test_walker.py", "tests/billing/coins/test_rate_sources.py", "tests/billing/test_watch_rules.py",
        "tests/billing/test_reversal_rules.py", "tests/billing/test_settlement_rules.py",
        "tests/billing/test_review_rules.py", "tests/billing/test_payment_rows.py",
        "tests/billing/test_reconcile_rules.py", "tests/billing/test_sweep_rules.py",
        "tests/billing/test_quote_rules.py",  # quote_create's refusals, reuse, rate limit, hold
        # session 15: how a pass reaches its quotes (per coin, per output, SOL by reference), its result
        "tests/billing/test_reorg_grouping.py",
        # session 16: a reversed debt paid back (debt_settle), rate_for's refusals / max age / peg,
        # format_amount, and how quote_refresh / _advance move a quote (timeouts, hold, exceptions)
        "tests/billing/test_payment_remainder_rules.py",
        "tests/billing/test_price_guard.py",  # the price guard: agreement, move bound, anchor, its property
    ]),
    # Not mutated, the rest of billing/payments/: the chain adapters (coins/evm.py, utxo.py,
    # monero.py, solana.py: JSON-RPC against the chain nodes) and the key/address derivation
    # (coins/keys.py, addresses.py) are I/O and encodings tested against real daemons in
    # tests/billing/coins and tests/billing/test_*_chains.py, minutes per session, which cannot run
    # per mutant; coins/registry.py, base.py, config.py read settings and wire adapters (the rules'
    # values are settings, read by the tests above); selectors.py, views.py, admin.py, urls.py are
    # presentation; health.py (a watcher's liveness) and demo.py / coins/demo.py (the demo store's
    # fake coin) decide no money.
    "billing": (["billing/services.py", "billing/refunds.py", "billing/renewals.py"], [], [  # billing/ledger.py: the `ledger` module
        "tests/billing/test_lifecycle.py", "tests/billing/test_lifecycle_edges.py",
        "tests/billing/test_money_refunds.py", "tests/billing/test_money_property.py",
        "tests/billing/test_money_reversals.py", "tests/storage/test_my_storage_page.py",
        "tests/fleet/test_lifecycle_contract.py",
        "tests/security/test_refund_limit.py",  # refunds_left: REFUNDS_PER_MONTH
        "tests/ops/test_ordered_volume_edges.py",  # _lease_refund_claim: a pending add-on refunded first
        # session 15: the refund rules the first run found untested (refusals, the monthly allowance,
        # a pending add-on, lease_fail_and_refund's rows, notice and voided invoices)
        "tests/billing/test_refund_rules.py",
        # session 16: the order and renewal services' existing tests (the order page and top-up, the hoarding
        # limits and expiry, the renewal batch, "extend", the admin's manual settlement) and the order rules
        # the run found untested ("extend"'s limit, refusals and audit row, an order's expiry second and only
        # its own invoice, a snapshot filling the new disk exactly, the unpaid limit's refusal)
        "tests/billing/test_pages.py", "tests/security/test_hoarding.py", "tests/billing/test_lifecycle_batch.py",
        "tests/automation/test_extension.py", "tests/rental/test_admin.py",
        "tests/billing/test_order_rules.py",
        # session 16, second pass: the payment and renewal rules that pass found untested (paying what is no
        # longer open, one invoice paid and no other, the notice's language, batch payments, the note, the
        # webhooks' time and lease, a restore's actor, add-on prices)
        "tests/billing/test_invoice_rules.py",
    ]),
    # the balance itself (session 16): postings under the account lock, idempotency, the refusal to go below
    # zero, batches with refused="skip", top-ups, what is left to refund of an invoice
    "ledger": (["billing/ledger.py"], [], [
        "tests/billing/test_money_property.py", "tests/billing/test_money_refunds.py",
        "tests/billing/test_lifecycle_batch.py",  # not test_payments_holes.py: 30 payment tests that post, ~25 s
        # more per surviving mutant for the one refusal they read (the payments module runs them)
        "tests/billing/test_refund_rules.py", "tests/security/test_refund_limit.py",
        "tests/ops/test_ordered_volume_edges.py", "tests/ops/test_ledger_revenue.py",
        "tests/rental/test_api.py",
        # session 16: what the first run found untested: the entry's fields, repeats within a batch, the
        # refusal's message and edge, skip batches across customers, the statements, top-ups, month, claims
        "tests/billing/test_ledger_rules.py",
    ]),
    "fleet-desired": (["fleet/desired.py"], [], [
        "tests/fleet/test_lifecycle.py", "tests/fleet/test_lifecycle_contract.py",
        "tests/fleet/test_desired_etag.py", "tests/fleet/test_trust.py",
        "tests/fleet/test_node_state.py",  # a migration: the old node is told absent / destroy_key
        "tests/fleet/test_pages.py",  # the customer's stop / start / restart
        # what the first run found untested: op_ids, snapshot / restore ops, volumes, steady reads
        "tests/fleet/test_desired_rules.py",
        "tests/fleet/test_desired_version.py",  # the clock that ends a document's validator
        "tests/fleet/test_burn_in.py",  # the document's burn_in list
        # the remaining functions' run: which node a lease is on (current_node_id, instance_of's host), the ETag
        # remembered under the Redis run, the document's reads not growing with its leases
        "tests/fleet/test_desired_placement.py",
    ]),
    "fleet-evidence": (["fleet/evidence.py"], [], [
        "tests/fleet/test_evidence.py", "tests/fleet/test_sanitization_record.py",
        "tests/fleet/test_lifecycle.py", "tests/fleet/test_lifecycle_contract.py",
        # session 7: the field checks' refusals, migrations (old node's evidence), the
        # snapshot kinds' op checks (snapshot_taken / snapshot_restored)
        "tests/fleet/test_node_state.py", "tests/fleet/test_report_bounds.py", "tests/fleet/test_bad_input.py",
        # not tests/storage's snapshot files (session 16): they start a Ceph cluster, dockerd and restic per
        # session, 325 s of the selection's 353 s, for every surviving mutant; test_evidence_rules.py below
        # sends their snapshot records on SQLite, and the suite keeps them
        "tests/fleet/test_trust.py",
        "tests/fleet/test_evidence_fields.py",  # session 9: malformed common fields and commands
        # the rules the first complete run found unread: unknown kind / time / node, the key's
        # and the wipe's proofs, the quarantine's reason, snapshot_taken / snapshot_restored on SQLite,
        # resends that share a node, kind or op with another record
        "tests/fleet/test_evidence_rules.py",
    ]),
}

# Never linked into a work directory: mutmut's own output, caches, the virtualenvs.
SKIP = {".git", "var", "mutants", ".venv", ".mvenv", ".pytest_cache", ".ruff_cache", ".hypothesis",
        "pyproject.toml", "node_modules", ".chain-tools"}

STATUS = {1: "killed", 3: "killed", 0: "survived", 5: "no tests", 33: "no tests", 34: "skipped",
          36: "timeout", -24: "timeout", 24: "timeout", 152: "timeout", 255: "timeout", None: "not checked",
          37: "type check", -11: "segfault", -9: "segfault"}


def workdir(module: str) -> Path:
    sources, excluded, tests = MODULES[module]
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
        "source_paths": sources,
        "do_not_mutate": excluded,
        "pytest_add_cli_args_test_selection": tests,
        "also_copy": also_copy,
        "pytest_add_cli_args": ["-p", "no:xdist", "-p", "no:cacheprovider", "--nomigrations"],
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
    sources, excluded, _ = MODULES[module]
    files = []
    for src in sources:
        path = ROOT / src
        files += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    skipped = []
    for path in files:
        rel = path.relative_to(ROOT).as_posix()
        if rel in excluded:
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
        rows.append(f"| {m} | {', '.join(MODULES[m][0])} | {total} | {c['killed']} | {c['survived']} | "
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
            src, excl, tests = MODULES[m]
            print(f"{m}: {' '.join(src)}" + (f" (not {' '.join(excl)})" if excl else ""))
            print("    " + "\n    ".join(tests))
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
        print(f"== mutmut: {m} ({' '.join(MODULES[m][0])})", flush=True)
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
