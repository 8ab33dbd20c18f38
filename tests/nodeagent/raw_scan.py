"""Searching raw bytes (a disk image, a block device's backing file, a data root) for a
tenant's marker: every occurrence counted, free blocks included."""
import mmap
import os
from pathlib import Path


def count(path: Path, needle: bytes) -> int:
    with open(path, "rb") as f:
        if not os.fstat(f.fileno()).st_size:
            return 0
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            hits, at = 0, data.find(needle)
            while at >= 0:
                hits, at = hits + 1, data.find(needle, at + 1)
            return hits


def scan(paths, needle: bytes) -> dict[str, int]:
    """Hits per file among `paths` and every regular file below the directories in it."""
    found = {}
    for root in paths:
        files = [root] if root.is_file() else [p for p in root.rglob("*")
                                                 if p.is_file() and not p.is_symlink()]
        for path in files:
            try:
                hits = count(path, needle)
            except (OSError, ValueError):       # a socket, a file gone meanwhile
                continue
            if hits:
                found[str(path)] = hits
    return found
