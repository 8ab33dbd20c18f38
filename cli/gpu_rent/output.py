"""Printing: JSON for scripts (--json), aligned tables and key: value lines for people."""
import json
import sys

from .errors import OK, USAGE, CliError


def emit_json(data) -> None:
    json.dump(data, sys.stdout, indent=1, ensure_ascii=False)
    sys.stdout.write("\n")


def table(rows: list[dict], columns: list[tuple[str, str]]) -> None:
    """columns: (key, header). Missing values print as '-'."""
    cells = [[header for _key, header in columns]]
    cells += [["-" if row.get(key) in (None, "") else str(row.get(key)) for key, _h in columns] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    for line in cells:
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip())


def fields(data: dict, keys: list[str]) -> None:
    width = max(len(k) for k in keys)
    for key in keys:
        value = data.get(key)
        if isinstance(value, dict):
            value = ", ".join(f"{k}={v}" for k, v in value.items())
        print(f"{key.ljust(width)}  {'-' if value in (None, '') else value}")


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# Shared by the commands: a listing, a confirmation before something that cannot be undone,
# and what a write answers (JSON or a line).
def listing(api, args, path: str, columns, params=None, key: str | None = None) -> int:
    key = key or path
    rows = api.get(path, params=params)[key]
    if args.json:
        emit_json({key: rows})
    else:
        table(rows, columns)
    return OK


def confirmed(args, question: str) -> bool:
    if args.yes:
        return True
    if not sys.stdin.isatty():
        raise CliError(USAGE, "This cannot be undone: add --yes.")
    return input(f"{question} [y/N] ").strip().lower() == "y"


def reply(args, data: dict, text: str) -> int:
    emit_json(data) if args.json else print(text)
    return OK
