"""bench/lifecycle.py's due-work case: one lifecycle pass that has work — a
burst of terms ending in the same hour over a large history. Prints, per due count: the
pass time, time and database queries per due lease, each sweep's share, and whether the
pass finished the batch (else how many passes it took: how long the last lease waited).
Targets: ≤ 5 ms of pass time per due lease; for 10,000 due, one pass within the
lifecycle interval (LIFECYCLE_INTERVAL_SECONDS), so no due lease waits more than one."""
import os
import time
from contextlib import contextmanager
from pathlib import Path

from django.db import connection
from lifecycle_fill import DUE_GROUP, fill_due

TARGET_MS_PER_LEASE = 5.0


@contextmanager
def counted_queries(log=None):
    """The number of statements sent to the database inside the block (and, with `log`,
    each one's SQL appended to it)."""
    counter = {"n": 0}

    def count(execute, sql, params, many, context):
        counter["n"] += 1
        if log is not None:
            log.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(count):
        yield counter


@contextmanager
def timed_sweeps(times: dict[str, float], queries: dict[str, int]):
    """ops.lifecycle.SWEEPS with each sweep's time and queries added up."""
    from ops import lifecycle

    original = list(lifecycle.SWEEPS)

    def timed(name, sweep):
        def run(now, *a, **kw):
            started = time.perf_counter()
            try:
                with counted_queries() as counter:
                    return sweep(now, *a, **kw)
            finally:
                times[name] = times.get(name, 0.0) + time.perf_counter() - started
                queries[name] = queries.get(name, 0) + counter["n"]
        return run

    lifecycle.SWEEPS[:] = [(name, timed(name, sweep)) for name, sweep in original]
    try:
        yield
    finally:
        lifecycle.SWEEPS[:] = original


def due_case(args, fill, common) -> None:
    from django.conf import settings
    from django.contrib.auth.models import User
    from django.utils import timezone

    from billing.services import balance_top_up
    from ops.lifecycle import run_lifecycle
    from rental import rules
    from rental.models import Lease

    interval = settings.LIFECYCLE_INTERVAL_SECONDS
    print(f"\nDue work over {args.history:,} leases of history (lifecycle interval {interval:.0f} s):")
    rows = []
    for due in args.due:
        now = timezone.now().replace(microsecond=0)
        first = args.history + 1

        def add_due(due=due, now=now, first=first):
            fill_due(now=now, due=due, first_id=first, hold=rules.hold(), wipe=rules.wipe_within(), **common)

        started = time.perf_counter()
        fill(args.history, now, then=add_due)
        assert Lease.objects.order_by("-pk").values_list("pk", flat=True)[0] == args.history + due
        for user in User.objects.filter(pk__in=common["customers"][0::2]):  # the even g's customers pay
            balance_top_up(customer=user, amount_cents=6500 * due, now=now)
        print(f"\n{due:,} due leases over {args.history:,} (filled in {time.perf_counter() - started:.1f} s)")
        passes, times, per_sweep, queries, pass_seconds = 0, {}, {}, 0, []
        sql_log = [] if os.environ.get("BENCH_SQL_LOG") else None
        cpu_first = None
        while True:
            passes += 1
            before = dict(times)
            with timed_sweeps(times, per_sweep), counted_queries(sql_log) as counter:
                cpu = cpu_seconds()
                started = time.perf_counter()
                if os.environ.get("BENCH_PROFILE") and passes == 1:
                    import cProfile
                    cProfile.runctx("run_lifecycle(now)", globals(), {"run_lifecycle": run_lifecycle, "now": now},
                                    os.environ["BENCH_PROFILE"])
                else:
                    run_lifecycle(now)
                pass_seconds.append(time.perf_counter() - started)
                cpu = [b - a for a, b in zip(cpu, cpu_seconds(), strict=True)]
            cpu_first = cpu_first or cpu
            queries += counter["n"]
            left = still_due(first_id=first)
            slowest = sorted(((times[k] - before.get(k, 0.0), k) for k in times), reverse=True)[:3]
            print(f"  pass {passes}: {pass_seconds[-1]:.2f} s (CPU: Python {cpu[0]:.2f} s, PostgreSQL {cpu[1]:.2f} s), "
                  f"{counter['n']:,} queries; slowest sweeps "
                  + ", ".join(f"{k} {t:.1f} s" for t, k in slowest) + "; left for the next pass: "
                  + ", ".join(f"{k} {v}" for k, v in left.items()))
            if not any(left.values()) or passes == 20:
                break
        per_lease = 1000 * pass_seconds[0] / due
        shares = ", ".join(f"{name} {1000 * s / due:.2f} ms / {per_sweep[name] / due:.1f} q"
                           for name, s in sorted(times.items(), key=lambda i: -i[1]) if per_sweep[name] >= due / 10)
        print(f"  per due lease, by sweep (time, queries): {shares}")
        if sql_log is not None:
            Path(os.environ["BENCH_SQL_LOG"]).write_text("\n".join(sql_log))
        rows.append((due, pass_seconds[0], per_lease, queries / due, passes))
        print(f"  CPU per due lease in the first pass: Python {1000 * cpu_first[0] / due:.2f} ms + PostgreSQL "
              f"{1000 * cpu_first[1] / due:.2f} ms = {1000 * sum(cpu_first) / due:.2f} ms (the machine's load "
              "does not change CPU time; on an idle machine a pass takes about this plus the round trips)")
        print(f"due {due:,}: first pass {pass_seconds[0]:.2f} s, {per_lease:.2f} ms per due lease (target "
              f"≤ {TARGET_MS_PER_LEASE:.0f}), {queries / due:.1f} queries per due lease, "
              f"{'finished in one pass' if passes == 1 else f'{passes} passes to finish'}; longest wait "
              f"{(passes - 1) * interval:.0f} s (target: one pass, under {interval:.0f} s)")
    print("\n   due  history   pass s  ms/due  queries/due  passes")
    for due, seconds, per_lease, per_queries, passes in rows:
        print(f"{due:>6,} {args.history:>8,} {seconds:8.2f} {per_lease:7.2f} {per_queries:12.1f} {passes:7d}")


def cpu_seconds() -> tuple[float, float]:
    """CPU seconds used so far by this process and by its PostgreSQL backend (same host:
    /proc/<pid>/stat; 0 when the server is elsewhere)."""
    with connection.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        pid = cur.fetchone()[0]
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        backend = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        backend = 0.0
    return time.process_time(), backend


def still_due(*, first_id) -> dict[str, int]:
    """Work of the due set that a pass left for the next one, by kind."""
    group = DUE_GROUP
    queries = {
        "renewal invoice": f"""SELECT count(*) FROM rental_lease l WHERE id >= %(first)s AND {group} < 2
            AND NOT EXISTS (SELECT 1 FROM billing_invoice i WHERE i.lease_id = l.id AND i.kind = 'renewal')""",
        "reminder": f"""SELECT count(*) FROM rental_lease l WHERE id >= %(first)s AND {group} < 2
            AND NOT EXISTS (SELECT 1 FROM rental_notification n WHERE n.lease_id = l.id
            AND n.kind LIKE 'reminder_%%')""",
        "suspension": f"SELECT count(*) FROM rental_lease WHERE id >= %(first)s AND {group} = 2 AND state = 'active'",
        "release": f"SELECT count(*) FROM rental_lease WHERE id >= %(first)s AND {group} = 3 AND state = 'suspended'",
        "wipe": f"SELECT count(*) FROM rental_lease WHERE id >= %(first)s AND {group} = 3 AND state <> 'wiped'",
    }
    out = {}
    with connection.cursor() as cur:
        for name, sql in queries.items():
            cur.execute(sql, {"first": first_id})
            out[name] = cur.fetchone()[0]
    return out
