"""CPU priority of the storefront's processes on a shared host: the customers' requests (the
web) first, the fleet's reports and waits (the watch) next, the background jobs (Celery's
workers and beat) last. A niceness orders the threads of one session or cgroup; a process
that leads a session of its own (a supervisor's setsid) under Linux's autogroup, or a
container of its own, needs its group lowered as well: the first here, the second by the
container's `cpu_shares` (docker-compose.yml).

    python -m storefront.priority WATCH_NICENESS granian ...   # lower, then exec the server

Raised before the server starts any thread: Linux keeps a niceness per thread, and threads
and children inherit it (granian's Rust threads do the watch's HTTP work)."""
import os
import sys
from pathlib import Path

AUTOGROUP = Path("/proc/self/autogroup")


def lower_priority(niceness: int) -> int:
    """At least `niceness` for this process (raised, never lowered, so asking twice changes
    nothing), and for its session's autogroup when it leads one; returns the niceness."""
    current = os.getpriority(os.PRIO_PROCESS, 0)
    if niceness > current:
        os.setpriority(os.PRIO_PROCESS, 0, niceness)
    niceness = os.getpriority(os.PRIO_PROCESS, 0)
    _lower_own_session(niceness)
    return niceness


def _lower_own_session(niceness: int) -> None:
    """Linux's autogroup (kernel.sched_autogroup_enabled) shares the CPU between sessions
    first and by niceness only within one: a process that leads a session of its own would,
    niced alone, still take a whole session's share beside the web's. Its session's group
    takes the niceness too, only when this process leads it: a session shared with the web
    is left alone, as niceness already works within it."""
    if os.getsid(0) != os.getpid():
        return
    try:
        group = int(AUTOGROUP.read_text().split()[-1])      # "/autogroup-113 nice 0"
        if niceness > group:
            AUTOGROUP.write_text(str(niceness))
    except (OSError, ValueError, IndexError):   # no autogroup in this kernel, or not Linux
        return


def main(argv: list[str]) -> None:
    """`python -m storefront.priority SETTING command...`: lower this process to the named
    setting's niceness (storefront/settings), then become the command."""
    if len(argv) < 3:
        sys.exit("usage: python -m storefront.priority SETTING command [args...]")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "storefront.settings")
    from django.conf import settings

    lower_priority(int(getattr(settings, argv[1])))
    os.execvp(argv[2], argv[2:])


if __name__ == "__main__":
    main(sys.argv)
