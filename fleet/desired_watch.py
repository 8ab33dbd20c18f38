"""A node learns of a change to its desired state within about a second, not on its next poll.

The desired-state version (fleet/desired_version.py) already moves on every change a node's
document is built from. A node that holds the version of its last document may ask
`GET /agent/v1/desired/watch?version=…&wait=…` (nodeagent/PROTOCOL.md): the answer comes as
soon as the version differs from the one it holds, or after `wait` seconds with nothing new.
It carries no document, only "changed"; the node then fetches the document the usual way.

How a waiting request hears of a change, in order of speed:
- the bell: every version bump in this process rings the waiters of the nodes it concerns;
- Redis pub/sub: every bump is published on one channel, and one thread per process
  (started with the first watch) rings the bell for what other processes published;
- the recheck: every NODE_WATCH_RECHECK_SECONDS a waiter reads its version again, so a lost
  message (Redis restarted, a publish that failed open) delays a node by that at most, and a
  cache without pub/sub (the demo's local memory) still works.

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


class Bell:
    """The waiters of this process, by node; ringing is safe from any thread."""

    def __init__(self):
        self._lock = threading.Lock()
        self._waiting: dict[int, set[tuple[asyncio.AbstractEventLoop, asyncio.Event]]] = {}

    def waiter(self, node_id: int) -> "_Waiter":
        return _Waiter(self, node_id)

    def ring(self, node_ids: Iterable[int] | str) -> int:
        """Wake the waiters of these nodes (EVERY_NODE: all); returns how many."""
        with self._lock:
            if node_ids == EVERY_NODE:
                targets = [w for waiters in self._waiting.values() for w in waiters]
            else:
                targets = [w for n in set(node_ids) for w in self._waiting.get(n, ())]
        for loop, event in targets:
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:          # its loop closed: the request is gone
                pass
        return len(targets)

    def count(self) -> int:
        with self._lock:
            return sum(len(w) for w in self._waiting.values())

    def _add(self, node_id, entry) -> None:
        with self._lock:
            self._waiting.setdefault(node_id, set()).add(entry)

    def _remove(self, node_id, entry) -> None:
        with self._lock:
            waiters = self._waiting.get(node_id)
            if waiters is not None:
                waiters.discard(entry)
                if not waiters:
                    del self._waiting[node_id]


class _Waiter:
    """Registered before the version is read, so a change between the read and the wait
    still wakes it."""

    def __init__(self, bell: Bell, node_id: int):
        self.bell, self.node_id = bell, node_id
        self.event = asyncio.Event()
        self._entry = (asyncio.get_running_loop(), self.event)

    def __enter__(self):
        self.bell._add(self.node_id, self._entry)
        return self

    def __exit__(self, *exc):
        self.bell._remove(self.node_id, self._entry)

    async def rung(self, timeout: float) -> bool:
        """True when rung within `timeout` seconds (and ready to be rung again)."""
        try:
            await asyncio.wait_for(self.event.wait(), timeout=max(0.0, timeout))
        except TimeoutError:
            return False
        self.event.clear()
        return True


bell = Bell()


# --- across processes: Redis pub/sub -------------------------------------------------------------

def _redis():
    """The raw Redis client behind the cache, or None (a cache without pub/sub)."""
    client_of = getattr(cache, "redis_client", None)
    return client_of() if client_of is not None else None


def _channel() -> str:
    return cache.make_key(CHANNEL)


def announce(node_ids: list[int] | str) -> None:
    """Called by every version bump: ring this process's waiters, tell the others."""
    bell.ring(EVERY_NODE if node_ids == EVERY_NODE else node_ids)
    client = _redis()
    if client is None:
        return
    message = EVERY_NODE if node_ids == EVERY_NODE else ",".join(map(str, node_ids))
    try:
        client.publish(_channel(), message)
    except Exception as exc:          # fails open like the cache: the recheck bounds the delay
        logger.warning("could not publish a desired-state change: %s", exc)


class _Listener(threading.Thread):
    """One per process: rings the bell for the changes other processes publish. After a lost
    connection it rings every waiter (messages may have been missed) and subscribes again."""

    def __init__(self):
        super().__init__(name="desired-watch-listener", daemon=True)

    def run(self) -> None:
        failures = 0
        while True:
            client = _redis()
            if client is None:
                return
            try:
                pubsub = client.pubsub(ignore_subscribe_messages=True)
                pubsub.subscribe(_channel())
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
                failures += 1
                logger.warning("desired-state change listener: %s; subscribing again", exc)
                time.sleep(_RECONNECT_SECONDS[min(failures, len(_RECONNECT_SECONDS)) - 1])


def _ring_for(data) -> None:
    text = data.decode() if isinstance(data, bytes) else str(data or "")
    if text == EVERY_NODE:
        bell.ring(EVERY_NODE)
        return
    bell.ring([int(part) for part in text.split(",") if part.isdigit()])


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
