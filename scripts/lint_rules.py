"""The money rules' own lint (ADR 0024), run by `make lint`: a few semgrep-style checks over
the syntax tree that ruff and import-linter cannot express. Each rule has tests in
tests/lint/test_rules.py showing it catches a bad snippet and passes a good one.

  ledger-writes       ledger rows (billing.models.LedgerEntry) are created, changed or deleted
                      only by billing/ledger.py (ledger_post / ledger_post_many): the balance
                      and its entry move together under the account's row lock.
  network-in-atomic   no network call (requests, httpx, urllib, socket, smtplib, Django's
                      send_mail and the other django.core.mail functions) and no Celery
                      .delay / .apply_async inside `with transaction.atomic()` or an
                      @transaction.atomic function, except inside transaction.on_commit(...):
                      a slow peer would hold the row locks, and a task sent before COMMIT may
                      run before (or without) the rows it reads.
  row-locks           select_for_update (or a raw SQL string's FOR UPDATE) only in the modules
                      of ROW_LOCKS_ALLOWED (each with its reason), and a customer's balance
                      row (billing's Account) only through billing/ledger.py's lock helpers
                      (_accounts_locked, _account_locked).
  test-imports        tests import nothing from a test_*.py module, none exempt: builders shared
                      between test files live in a plain module (tests/factories.py, or one
                      beside their users such as tests/<package>/helpers.py), fixtures in the
                      nearest conftest.py (a fixture imported into a test module is a second
                      copy of it).
  module-size         no app module over MAX_LINES lines (MODULE_SIZE_ALLOWED: today's, to split).
  tracker-refs        no tracker numbers (the word issue, then a number) in code, tests or
                      comments: a clone has no tracker, so the reason goes in the text itself
                      or in docs/adr/.
  lock-pins           every `==` pin of pyproject.toml is the version requirements/*.lock holds
                      (else: `make lock`).

The checks are local to one module and follow no calls: a network call or a ledger write
reached through another function is not seen. The allow-lists (*_ALLOWED), each entry with its
reason, are in scripts/lint_allowlists.py.

Usage: scripts/lint_rules.py [PATH ...]   (default: the app packages and tests/; exit 1 on findings)
"""
from __future__ import annotations

import ast
import re
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parent))
from lint_allowlists import (  # noqa: E402  (scripts/ is no package)
    ACCOUNT_LOCKS_ALLOWED,
    MODULE_SIZE_ALLOWED,
    ROW_LOCKS_ALLOWED,
)

ROOT = Path(__file__).resolve().parent.parent
APP_DIRS = ("storefront", "fleet", "ops", "storage", "billing", "rental", "inventory", "sizing", "core", "nodeagent", "bench",
            "cli/gpu_rent", "scripts")
TEST_DIRS = ("tests",)
MAX_LINES = 500

# --- allow-lists: scripts/lint_allowlists.py (path relative to the repository root -> why) -----

LEDGER_MODULE = "billing/ledger.py"
SELF = {"scripts/lint_rules.py", "scripts/lint_allowlists.py"}  # they name what the rules look for


@dataclass(frozen=True)
class Finding:
    rule: str
    path: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: [{self.rule}] {self.message}"


# --- helpers ------------------------------------------------------------------------------

def _chain(node: ast.AST) -> list[ast.AST]:
    """The receivers of a call chain, outermost first: a.b().c -> [a.b().c, a.b(), a.b, a]."""
    out = []
    while True:
        out.append(node)
        if isinstance(node, ast.Attribute):
            node = node.value
        elif isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.Subscript):
            node = node.value
        else:
            return out


def _root_name(node: ast.AST) -> str | None:
    last = _chain(node)[-1]
    return last.id if isinstance(last, ast.Name) else None


def _dotted(node: ast.AST) -> str | None:
    """a.b.c for a Name/Attribute chain without calls, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _mentions(node: ast.AST, names: set[str]) -> bool:
    """Whether a call chain's receivers name one of these (as a name or an attribute)."""
    for part in _chain(node):
        if isinstance(part, ast.Name) and part.id in names:
            return True
        if isinstance(part, ast.Attribute) and part.attr in names:
            return True
    return False


def _imported_as(tree: ast.Module, name: str) -> set[str]:
    """The local names a `from ... import name [as x]` binds, and the name itself."""
    out = {name}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if alias.name == name:
                    out.add(alias.asname or alias.name)
    return out


# --- rule (a): ledger rows only through billing/ledger.py ---------------------------------

LEDGER_WRITES = {"create", "bulk_create", "get_or_create", "update_or_create", "update", "bulk_update",
                 "delete", "save"}


def rule_ledger_writes(path: str, tree: ast.Module) -> list[Finding]:
    if path == LEDGER_MODULE:
        return []
    names = _imported_as(tree, "LedgerEntry")
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        direct = (isinstance(func, ast.Name) and func.id in names) or (
            isinstance(func, ast.Attribute) and func.attr in names)
        via_manager = (isinstance(func, ast.Attribute) and func.attr in LEDGER_WRITES
                       and _mentions(func.value, names))
        if direct or via_manager:
            out.append(Finding("ledger-writes", path, node.lineno,
                               "ledger rows are written only by billing/ledger.py (ledger_post, ledger_post_many)"))
    return out


# --- rule (b): no network call inside a transaction ---------------------------------------

NETWORK_MODULES = {"requests", "httpx", "urllib", "urllib3", "socket", "smtplib", "http"}
MAIL_MODULE = "django.core.mail"  # send_mail and friends talk SMTP (EmailMessage.send is not seen)
CELERY_SENDS = {"delay", "apply_async"}


def _is_atomic(expr: ast.AST, atomic_names: set[str]) -> bool:
    if isinstance(expr, ast.Call):
        expr = expr.func
    dotted = _dotted(expr)
    return dotted is not None and (dotted in atomic_names or dotted.endswith("transaction.atomic"))


def _is_on_commit(call: ast.Call) -> bool:
    dotted = _dotted(call.func)
    return dotted is not None and (dotted == "on_commit" or dotted.endswith(".on_commit"))


def _network_names(tree: ast.Module) -> tuple[set[str], set[str]]:
    """(local names of network modules, local names of functions/classes imported from them)."""
    modules: set[str] = set()  # only what the module imports: a local `requests` list is no client
    members: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in NETWORK_MODULES:
                    modules.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] in NETWORK_MODULES or node.module == MAIL_MODULE:
                for alias in node.names:
                    members.add(alias.asname or alias.name)
            elif node.module == "django.core":
                modules.update(alias.asname or alias.name for alias in node.names if alias.name == "mail")
    return modules, members


def _network_calls(body: list[ast.stmt], modules: set[str], members: set[str]):
    """Calls in these statements that reach the network or send a task: not those inside
    transaction.on_commit(...), nor in functions and lambdas defined here (they run later)."""
    stack: list[ast.AST] = list(body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
            continue
        if isinstance(node, ast.Call):
            if _is_on_commit(node):
                continue
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr in CELERY_SENDS:
                yield node, f"a Celery .{func.attr}() inside a transaction (send it from transaction.on_commit)"
            elif _root_name(func) in modules:
                yield node, f"a network call ({_dotted(func) or _root_name(func)}) inside a transaction"
            elif isinstance(func, ast.Name) and func.id in members:
                yield node, f"a network call ({func.id}) inside a transaction"
        stack.extend(ast.iter_child_nodes(node))


def rule_network_in_atomic(path: str, tree: ast.Module) -> list[Finding]:
    atomic_names = _imported_as(tree, "atomic") | {"transaction.atomic"}
    modules, members = _network_names(tree)
    regions: list[list[ast.stmt]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.With | ast.AsyncWith):
            if any(_is_atomic(item.context_expr, atomic_names) for item in node.items):
                regions.append(node.body)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            if any(_is_atomic(d, atomic_names) for d in node.decorator_list):
                regions.append(node.body)
    seen: set[tuple[int, int]] = set()  # nested atomic blocks: one finding per call
    out = []
    for body in regions:
        for call, message in _network_calls(body, modules, members):
            key = (call.lineno, call.col_offset)
            if key not in seen:
                seen.add(key)
                out.append(Finding("network-in-atomic", path, call.lineno, message))
    return out


# --- rule (c): row locks ------------------------------------------------------------------

def rule_row_locks(path: str, tree: ast.Module) -> list[Finding]:
    account_names = set()
    for node in ast.walk(tree):  # billing's Account (not S3Account, not User): from billing.models / .models
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[-1] == "models":
            if node.level > 0 and not path.startswith("billing/") and node.module != "billing.models":
                continue
            if node.level == 0 and node.module != "billing.models":
                continue
            for alias in node.names:
                if alias.name == "Account":
                    account_names.add(alias.asname or alias.name)
    prose = {id(node.value) for node in ast.walk(tree)  # docstrings and other bare strings
             if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)}
    out = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Constant) and isinstance(node.value, str) and "FOR UPDATE" in node.value
                and id(node) not in prose and path not in ROW_LOCKS_ALLOWED and path not in SELF):  # raw SQL locks too
            out.append(Finding("row-locks", path, node.lineno,
                               "a raw FOR UPDATE outside the modules of ROW_LOCKS_ALLOWED (scripts/lint_allowlists.py)"))
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "select_for_update"):
            continue
        if account_names and _mentions(node.func.value, account_names) and path != LEDGER_MODULE \
                and path not in ACCOUNT_LOCKS_ALLOWED:
            out.append(Finding("row-locks", path, node.lineno,
                               "lock balance rows through billing.ledger (ledger_post takes the account's lock)"))
        elif path not in ROW_LOCKS_ALLOWED:
            out.append(Finding("row-locks", path, node.lineno,
                               "select_for_update outside the modules of ROW_LOCKS_ALLOWED "
                               "(scripts/lint_allowlists.py): add the module with its reason, or lock through its domain"))
    return out


# --- rule (d): no import from a test module -----------------------------------------------

def _module_of(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".").removesuffix(".__init__")


def _is_test_module(dotted: str) -> bool:
    return dotted.split(".")[-1].startswith("test_")


def rule_test_imports(path: str, tree: ast.Module) -> list[Finding]:
    if not path.startswith("tests/"):
        return []
    package = _module_of(path).rsplit(".", 1)[0] if not path.endswith("__init__.py") else _module_of(path)
    out = []
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[:len(parts) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names if alias.name.startswith("test_")]
        for target in targets:
            if target.startswith("tests") and _is_test_module(target):
                out.append(Finding("test-imports", path, node.lineno,
                                   f"imports from the test module {target}: move the shared builder to "
                                   "tests/factories.py or a plain module beside its users "
                                   "(tests/<package>/helpers.py), a shared fixture to the nearest conftest.py"))
    return out


# --- rule (e): module size ----------------------------------------------------------------

def rule_module_size(path: str, lines: int) -> list[Finding]:
    if path.startswith("tests/") or "/migrations/" in path or path in MODULE_SIZE_ALLOWED:
        return []
    if lines > MAX_LINES:
        return [Finding("module-size", path, 1, f"{lines} lines, over {MAX_LINES}: split the module")]
    return []


# --- rule (f): no tracker numbers ------------------------------------------------------------

_WORD = "issue"  # spelt apart, so that this module does not hold what it looks for
_TRACKER_REF = re.compile(rf"(?<![A-Za-z]){_WORD}[\s_]*#?\d+\b|\b{_WORD}s\s*#\d+|\({_WORD}\s*$", re.IGNORECASE | re.MULTILINE)


def rule_tracker_refs(path: str, source: str) -> list[Finding]:
    return [Finding("tracker-refs", path, source.count("\n", 0, m.start()) + 1,
                    "a tracker number: say the reason here or in docs/adr/ (a clone has no tracker)")
            for m in _TRACKER_REF.finditer(source)]


# --- lock-pins: pyproject.toml's pins are the locks' versions -----------------------------

def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _locked(text: str) -> dict[str, str]:
    return {_normal(m[1]): m[2] for m in re.finditer(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\;]+)", text, re.M)}


def _pins(requirements: list[str]) -> dict[str, str]:
    out = {}
    for req in requirements:
        m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?\s*==\s*([^\s;,]+)", req)
        if m:
            out[_normal(m[1])] = m[3]
    return out


def check_lock_pins(root: Path = ROOT) -> list[Finding]:
    out = []

    def compare(pyproject: str, requirements: list[str], lock: str) -> None:
        lock_path = root / lock
        if not lock_path.exists():
            out.append(Finding("lock-pins", lock, 1, "missing: run `make lock`"))
            return
        locked = _locked(lock_path.read_text())
        for name, version in _pins(requirements).items():
            if locked.get(name) != version:
                out.append(Finding("lock-pins", lock, 1, f"{pyproject} pins {name}=={version}, the lock holds "
                                   f"{locked.get(name, 'nothing')}: run `make lock`"))

    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    extras = project.get("optional-dependencies", {})
    compare("pyproject.toml", project["dependencies"], "requirements/run.lock")
    compare("pyproject.toml", project["dependencies"] + extras.get("test", []) + extras.get("agent", [])
            + extras.get("bench", []), "requirements/test.lock")
    cli = root / "cli" / "pyproject.toml"
    if cli.exists():
        compare("cli/pyproject.toml", tomllib.loads(cli.read_text())["project"]["dependencies"],
                "cli/requirements.lock")
    return out


# --- running ------------------------------------------------------------------------------

AST_RULES = {
    "ledger-writes": rule_ledger_writes,
    "network-in-atomic": rule_network_in_atomic,
    "row-locks": rule_row_locks,
    "test-imports": rule_test_imports,
}


# A module that contains none of these cannot break an AST rule (tests: an import line naming test_).
_WORTH_PARSING = re.compile(r"LedgerEntry|atomic|select_for_update|FOR UPDATE|Account|^\s*(from|import)\s.*\btest_",
                            re.M)


def check_source(source: str, path: str, rules: list[str] | None = None) -> list[Finding]:
    """The findings of these rules (all by default) in one module's source; `path` (relative
    to the repository root, with /) decides the allow-lists and which rules apply."""
    out = []
    wanted = [name for name in AST_RULES if (rules is None or name in rules)
              # the money rules are about app code; tests may build any state
              and (name == "test-imports" or not path.startswith("tests/"))]
    if wanted and re.search(_WORTH_PARSING, source):  # most modules say none of it: no parse (2 s of 3)
        tree = ast.parse(source, filename=path)
        for name in wanted:
            out.extend(AST_RULES[name](path, tree))
    if rules is None or "module-size" in rules:
        out.extend(rule_module_size(path, len(source.splitlines())))
    if rules is None or "tracker-refs" in rules:
        out.extend(rule_tracker_refs(path, source))
    return out


def _files(args: list[str]) -> list[Path]:
    roots = [ROOT / a for a in args] if args else [ROOT / d for d in APP_DIRS + TEST_DIRS]
    out = []
    for r in roots:
        if r.is_file():
            out.append(r)
        elif r.is_dir():
            out.extend(p for p in sorted(r.rglob("*.py")) if "/migrations/" not in p.as_posix())
    return out


def main(argv: list[str]) -> int:
    findings = []
    for file in _files(argv):
        path = file.resolve().relative_to(ROOT).as_posix()
        findings.extend(check_source(file.read_text(encoding="utf-8"), path))
    if not argv:
        findings.extend(check_lock_pins())
    for f in findings:
        print(f)
    if findings:
        print(f"lint_rules: {len(findings)} finding(s) (rules: scripts/lint_rules.py; allow-lists: scripts/lint_allowlists.py)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
