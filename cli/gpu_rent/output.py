"""Printing: JSON for scripts (--json), aligned tables and key: value lines for people."""
import json
import sys


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
