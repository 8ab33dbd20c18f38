"""What PostgreSQL did over a bench's counted window: its statements by total time
(pg_stat_statements, which the server must preload: bench/private_services.py's options),
its commits, and the rows written and the autovacuum runs per table.

    window = StatementWindow(database_url)     # the extension created in that database
    window.start()                             # the counters reset, the tables' read
    ... the counted window ...
    window.stop()                              # what they are now
    for line in window.report(seconds, top=12):
        print(line)
"""
import psycopg

PRELOAD = "shared_preload_libraries=pg_stat_statements"

_TABLES = ("SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del, autovacuum_count, autoanalyze_count "
           "FROM pg_stat_user_tables")
_COMMITS = "SELECT xact_commit, xact_rollback FROM pg_stat_database WHERE datname = current_database()"


class StatementWindow:
    def __init__(self, url: str):
        self.url = url
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        self.tables: dict = {}
        self.commits = self.commits_after = (0, 0)
        self.rows: list = []
        self.tables_after: dict = {}

    def start(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute("SELECT pg_stat_statements_reset()")
            conn.execute("SELECT pg_stat_clear_snapshot()")
            self.tables = {row[0]: row[1:] for row in conn.execute(_TABLES)}
            self.commits = conn.execute(_COMMITS).fetchone()

    def stop(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            self.rows = conn.execute(
                "SELECT calls, total_exec_time, rows, shared_blks_hit + shared_blks_read, wal_bytes, query "
                "FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = "
                "current_database()) AND query NOT LIKE '%pg_stat%' ORDER BY total_exec_time DESC").fetchall()
            conn.execute("SELECT pg_stat_clear_snapshot()")
            self.tables_after = {row[0]: row[1:] for row in conn.execute(_TABLES)}
            self.commits_after = conn.execute(_COMMITS).fetchone()

    def report(self, seconds: float, top: int = 12) -> list[str]:
        rows, tables, commits = self.rows, self.tables_after, self.commits_after
        total = sum(row[1] for row in rows) or 1.0
        lines = [f"  PostgreSQL over {seconds:g} s: statements {sum(r[0] for r in rows) / seconds:.0f}/s taking "
                 f"{total / seconds / 10:.1f} % of a core in execution; commits {(commits[0] - self.commits[0]) / seconds:.0f}/s, "
                 f"rollbacks {(commits[1] - self.commits[1]) / seconds:.1f}/s; WAL "
                 f"{float(sum(r[4] for r in rows)) / seconds / 1024:.0f} KiB/s",
                 "  | calls/s | ms each | share | rows/call | buffers/call | statement |",
                 "  |---:|---:|---:|---:|---:|---|"]
        for calls, ms, nrows, buffers, _, query in rows[:top]:
            text = " ".join(query.split())
            lines.append(f"  | {calls / seconds:.1f} | {ms / max(calls, 1):.3f} | {100 * ms / total:.1f} % | "
                         f"{nrows / max(calls, 1):.1f} | {buffers / max(calls, 1):.0f} | {text[:150]} |")
        written = []
        for name, after in tables.items():
            before = self.tables.get(name, (0,) * 6)
            delta = [a - b for a, b in zip(after, before, strict=True)]
            if any(delta):
                written.append((delta[0] + delta[1] + delta[3], name, delta))
        lines.append("  tables written (per s: inserted / updated (HOT) / deleted; autovacuum, autoanalyze runs): "
                     + "; ".join(f"{name} {d[0] / seconds:.1f} / {d[1] / seconds:.1f} ({d[2] / seconds:.1f}) / "
                                 f"{d[3] / seconds:.1f}; {d[4]}, {d[5]}"
                                 for _, name, d in sorted(written, reverse=True)[:8]))
        return lines
