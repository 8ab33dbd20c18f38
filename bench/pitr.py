"""How long pgBackRest takes to back up and to restore to a point in time a database of a
given size (docs/operations/high-availability.md, docs/performance.md): a throwaway cluster
archiving its WAL (tests/ha/cluster.py), filled by `pgbench -i -s SCALE` (about 15 MiB per
unit of scale), a full backup, a minute of writes after a noted time, then a restore to that
time into a fresh data directory, recovered and promoted. Prints the figures.

    .venv/bin/python bench/pitr.py --scale 70      # about 1 GiB
"""
import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.deadlines import wait_for  # noqa: E402
from tests.ha import cluster  # noqa: E402
from tests.ha.cluster import PgBackRest, Postgres, psql  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=int, default=70, help="pgbench scale (about 15 MiB each)")
    parser.add_argument("--process-max", type=int, default=2, help="pgBackRest's parallel processes")
    args = parser.parse_args()
    root = cluster.owned_tempdir("bench-pitr-")
    pg, restored = Postgres(root), Postgres(root, "restored")
    backrest = PgBackRest(root, pg)
    try:
        pg.initdb().start("archive_mode=on", backrest.archive_command(), "wal_level=replica", "archive_timeout=60",
                          "max_wal_size=4GB", "fsync=on")
        psql(pg.port, "CREATE DATABASE store")
        started = time.monotonic()
        cluster.run(f"{pg.bin}/pgbench", "-h", "127.0.0.1", "-p", str(pg.port), "-U", "postgres", "-i", "-q",
                    "-s", str(args.scale), "store", timeout=3600, server=False)
        size = int(psql(pg.port, "SELECT pg_database_size('store')"))
        print(f"filled: {size / 2**20:.0f} MiB in {time.monotonic() - started:.0f} s", flush=True)
        backrest("stanza-create")
        started = time.monotonic()
        backrest("backup", "--type=full", f"--process-max={args.process_max}", timeout=3600)
        print(f"full backup: {time.monotonic() - started:.1f} s", flush=True)
        psql(pg.port, "CREATE TABLE marks (n int, at timestamptz DEFAULT clock_timestamp())", db="store")
        psql(pg.port, "INSERT INTO marks (n) VALUES (1)", db="store")
        target = psql(pg.port, "SELECT clock_timestamp()")
        cluster.run(f"{pg.bin}/pgbench", "-h", "127.0.0.1", "-p", str(pg.port), "-U", "postgres", "-T", "20",
                    "-c", "2", "store", timeout=120, server=False)
        psql(pg.port, "INSERT INTO marks (n) VALUES (2)", db="store")
        backrest("check")
        started = time.monotonic()
        backrest("restore", f"--pg1-path={restored.data}", "--type=time", f"--target={target}",
                 "--target-action=promote", f"--process-max={args.process_max}", timeout=3600)
        restored_at = time.monotonic() - started
        restored.start("archive_mode=off", "fsync=on")  # as production replays: fsync on
        wait_for(lambda: psql(restored.port, "SELECT pg_is_in_recovery()") == "f", 3600, "recovery",
                 ignore=(AssertionError,))
        took = time.monotonic() - started
        marks = psql(restored.port, "SELECT string_agg(n::text, ',') FROM marks", db="store")
        assert marks == "1", f"the restore holds marks {marks!r}, not only the one before the target"
        print(f"restore to {target} of {size / 2**20:.0f} MiB: files {restored_at:.1f} s, with WAL replay "
              f"and promotion {took:.1f} s")
    finally:
        restored.stop()
        pg.stop()
        cluster.remove(root)


if __name__ == "__main__":
    main()
