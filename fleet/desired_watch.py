"""A node learns of a change to its desired state within about a second, not on its next poll.

The desired-state version (fleet/desired_version.py) already moves on every change a node's
document is built from. A node that holds the version of its last document may ask
`GET /agent/v1/desired/watch?version=…&wait=…` (nodeagent/PROTOCOL.md): the answer comes as
soon as the version differs from the one it holds, or after `wait` seconds with nothing new.
It carries no document, only "changed"; the node then fetches the document the usual way.

How a waiting request hears of a change:
- the bell: every committed version bump in this process rings the waiters of the nodes it
  concerns, with the bump's token, so a waiter answers without reading anything;
- Redis pub/sub: every such bump is published on one channel, and one thread per process
  (started with the first watch) rings the bell for what other processes published;
- the recheck: only while that thread is not subscribed (Redis down, or a cache without
  pub/sub: the demo's local memory) a waiter reads its version again every
  NODE_WATCH_RECHECK_SECONDS. Each time the thread loses or regains its subscription it
  rings every waiter without news, so each reads its version once: a message lost meanwhile
  delays nobody further. A subscribed process spends no CPU on waiting nodes.

A waiting request costs memory, not CPU, only under ASGI (scripts/start.sh watch): under WSGI it
would hold one of the web server's few threads, so there it is answered at once unless
NODE_WATCH_WSGI_HOLD_SECONDS says otherwise (the tests' live server does)."""
import asyncio
import logging
import threading
import time
from collections.abc import Iterable

from django.core.cache import cache

logger = logging.getLogger("fleet.desired_watch")

CHANNEL = "fleet:desired:bumps"
EVERY_NODE = "*"
_RECONNECT_SECONDS = (0.5, 1, 2, 5)


def version_token(stamp: tuple | None) -> str:
    """The version a node is told it holds: the fleet epoch and its own version together
    ("" without a cache: nothing to watch)."""
    return f"{stamp[0]}.{stamp[1]}" if stamp else ""


def version_after(given: str, news: tuple[str, str]) -> str | None:
    """The version of a node that held `given` after the bump `news` (("node", token): its own
    version moved; ("epoch", token): the whole fleet's): at least as new as the current one,
    and unlike `given`. None when `given` is not a token this storefront issued."""
    epoch, dot, version = given.partition(".")
    if not dot:
        return None
    kind, token = news
    return f"{epoch}.{token}" if kind == "node" else f"{token}.{version}"


class Bell:
    """The waiters of this process, by node; ringing is safe from any thread."""

    def __init__(self):
        self._lock = threading.Lock()
        self._waiting: dict[int, set[_Waiter]] = {}
        # The last news heard for each node and for the whole fleet, with when (monotonic):
        # a waiter registered after reading its version learns of a change that came between.
        self._last: dict[int, tuple[float, tuple[str, str] | None]] = {}
        self._last_all: tuple[float, tuple[str, str] | None] = (0.0, None)

    def waiter(self, node_id: int, *, read_at: float | None = None) -> "_Waiter":
        """`read_at`: when (time.monotonic()) the caller read the version it compares with;
        news heard since then rings the waiter as soon as it is registered."""
        return _Waiter(self, node_id, read_at)

    def ring(self, node_ids: Iterable[int] | str, news: tuple[str, str] | None = None) -> int:
        """Wake the waiters of these nodes (EVERY_NODE: all) with `news` (see version_after;
        None: read your version again); returns how many."""
        now = time.monotonic()
        with self._lock:
            if node_ids == EVERY_NODE:
                self._last_all = (now, news)
                targets = [w for waiters in self._waiting.values() for w in waiters]
            else:
                node_ids = set(node_ids)
                self._last.update((n, (now, news)) for n in node_ids)
                targets = [w for n in node_ids for w in self._waiting.get(n, ())]
        for waiter in targets:
            waiter.tell(news)
        return len(targets)

    def count(self) -> int:
        with self._lock:
            return sum(len(w) for w in self._waiting.values())

    def _add(self, waiter) -> None:
        with self._lock:
            self._waiting.setdefault(waiter.node_id, set()).add(waiter)
            if waiter.read_at is not None:
                heard = [h for h in (self._last.get(waiter.node_id), self._last_all)
                         if h is not None and h[0] >= waiter.read_at]
                for _at, news in heard:
                    waiter.news = news if waiter.news is None else waiter.news
                    waiter.rang = True
                    waiter.event.set()

    def _remove(self, waiter) -> None:
        with self._lock:
            waiters = self._waiting.get(waiter.node_id)
            if waiters is not None:
                waiters.discard(waiter)
                if not waiters:
                    del self._waiting[waiter.node_id]


class _Waiter:
    """Registered before the version is read, so a change between the read and the wait
    still wakes it. `news`: the last bump it was told of (None: read the version again)."""

    def __init__(self, bell: Bell, node_id: int, read_at: float | None = None):
        self.bell, self.node_id, self.read_at = bell, node_id, read_at
        self.event = asyncio.Event()
        self.loop = asyncio.get_running_loop()
        self.news: tuple[str, str] | None = None
        self.rang = False     # rung since the last rung(): the event alone is also set by the time limit

    def __enter__(self):
        self.bell._add(self)
        return self

    def __exit__(self, *exc):
        self.bell._remove(self)

    def tell(self, news) -> None:
        def wake():
            self.news = news if self.news is None or news is not None else self.news
            self.rang = True
            self.event.set()
        try:
            self.loop.call_soon_threadsafe(wake)
        except RuntimeError:          # its loop closed: the request is gone
            pass

    async def rung(self, timeout: float | None) -> bool:
        """True when rung within `timeout` seconds (None: until rung), then ready again. The
        time limit is a timer that sets the event, not asyncio.wait_for: that adds a task, its
        context and a cancellation to every wait, objects the collector walks for as long as
        the node waits (bench/fleet_report_cpu.py, "kept")."""
        if not self.event.is_set():
            timer = None if timeout is None else self.loop.call_later(max(0.0, timeout), self.event.set)
            try:
                await self.event.wait()
            finally:
                if timer is not None:
                    timer.cancel()
        rang, self.rang = self.rang, False
        self.event.clear()
        return rang


bell = Bell()


# --- across processes: Redis pub/sub -------------------------------------------------------------

def _redis():
    """The raw Redis client behind the cache, or None (a cache without pub/sub)."""
    client_of = getattr(cache, "redis_client", None)
    return client_of() if client_of is not None else None


def _channel() -> str:
    """Channels are server-wide, not per database: named after the cache's database too, so
    two stores (or test runs) sharing a Redis server on different databases never hear each
    other's node ids."""
    client = _redis()
    db = client.connection_pool.connection_kwargs.get("db", 0) if client is not None else 0
    return f"{cache.make_key(CHANNEL)}:db{db}"


def announce(node_ids: list[int] | str, token: str) -> None:
    """Called by every committed version bump (EVERY_NODE: the fleet's epoch moved to `token`,
    else these nodes' versions did): ring this process's waiters, tell the others."""
    news = ("epoch", token) if node_ids == EVERY_NODE else ("node", token)
    bell.ring(node_ids, news)
    client = _redis()
    if client is None:
        return
    message = f"{token}|{EVERY_NODE if node_ids == EVERY_NODE else ','.join(map(str, node_ids))}"
    try:
        client.publish(_channel(), message)
    except Exception as exc:          # fails open like the cache: the recheck bounds the delay
        logger.warning("could not publish a desired-state change: %s", exc)


class _Listener(threading.Thread):
    """One per process: rings the bell for the changes other processes publish. Losing its
    subscription and getting it back each ring every waiter without news: they read their
    versions (a message may have been missed) and, while it is lost, recheck on a timer."""

    def __init__(self):
        super().__init__(name="desired-watch-listener", daemon=True)
        self.subscribed = False

    def run(self) -> None:
        failures = 0
        while True:
            client = _redis()
            if client is None:
                return
            try:
                pubsub = client.pubsub(ignore_subscribe_messages=True)
                pubsub.subscribe(_channel())
                pubsub.get_message(timeout=1.0)        # the confirmation: subscribed from here on
                self.subscribed = True
                if failures:
                    bell.ring(EVERY_NODE)
                failures = 0
                while True:
                    # get_message waits on the socket for up to `timeout` (the cache's short
                    # socket timeout would break listen() on an idle channel)
                    message = pubsub.get_message(timeout=1.0)
                    if message is not None:
                        _ring_for(message.get("data"))
            except Exception as exc:
                if self.subscribed:
                    self.subscribed = False
                    bell.ring(EVERY_NODE)
                failures += 1
                logger.warning("desired-state change listener: %s; subscribing again", exc)
                time.sleep(_RECONNECT_SECONDS[min(failures, len(_RECONNECT_SECONDS)) - 1])


def _ring_for(data) -> None:
    """A published bump: `<token>|*` (the fleet's epoch) or `<token>|<node id>,<node id>…`."""
    text = data.decode() if isinstance(data, bytes) else str(data or "")
    token, _, nodes = text.partition("|")
    if nodes == EVERY_NODE:
        bell.ring(EVERY_NODE, ("epoch", token))
    else:
        bell.ring([int(part) for part in nodes.split(",") if part.isdigit()], ("node", token))


def listening() -> bool:
    """Whether this process hears every other process's changes (subscribed now)."""
    return _listener is not None and _listener.subscribed


_listener: _Listener | None = None
_listener_lock = threading.Lock()


def ensure_listening() -> None:
    global _listener
    if _listener is not None and _listener.is_alive():
        return
    with _listener_lock:
        if (_listener is None or not _listener.is_alive()) and _redis() is not None:
            _listener = _Listener()
            _listener.start()
