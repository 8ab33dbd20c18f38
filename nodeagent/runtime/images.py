"""Image pulls beside the converge loop (issue 23): a multi-GB pull for one lease must not
delay the reports or the other leases' operations. A lease whose image is missing asks for
a pull and reports `image_pulling` until it is there; one worker thread pulls, one image at
a time (the node's uplink is the bottleneck), with its own Docker client.

Only images this agent pulled are ever pruned (the book in `<state>/runtime/images.json`):
once no longer configured in `[images]` and used by no container. An image the operator
loaded by hand is never touched."""
import logging
import queue
import threading
import time
from pathlib import Path

import docker
from docker.errors import DockerException, ImageNotFound

from ..state import read_json, write_json

log = logging.getLogger(__name__)
PULL_RETRY_SECONDS = 300        # a failed pull is reported, then tried again after this


class ImagePuller:
    def __init__(self, socket: str, book_path: Path, *, keep: frozenset[str] = frozenset()):
        self.socket, self.book_path, self.keep = socket, Path(book_path), frozenset(keep)
        self._queue: queue.Queue[str] = queue.Queue()
        self._lock = threading.Lock()
        self._pending: set[str] = set()
        self._failed: dict[str, tuple[float, str]] = {}
        self._thread: threading.Thread | None = None
        self._client = None

    # -- from the converge loop ------------------------------------------------------------
    def request(self, ref: str) -> None:
        """Queue a pull of `ref` (once: a pull already queued or running is not repeated)."""
        with self._lock:
            if ref in self._pending:
                return
            self._pending.add(ref)
            self._failed.pop(ref, None)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._work, name="image-puller",
                                                daemon=True)
                self._thread.start()
        self._queue.put(ref)

    def pulling(self, ref: str) -> bool:
        with self._lock:
            return ref in self._pending

    def failure(self, ref: str) -> str | None:
        """Why the last pull of `ref` failed, while it is too early to try again."""
        with self._lock:
            failed = self._failed.get(ref)
            if failed and time.monotonic() - failed[0] < PULL_RETRY_SECONDS:
                return failed[1]
            return None

    def wait_idle(self, timeout: float) -> bool:
        """For tests and the CLI: whether every queued pull finished within `timeout`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if not self._pending:
                    return True
            time.sleep(0.1)
        return False

    # -- the work itself (also used synchronously by `gpu-node-agent images`) -------------
    def pull(self, ref: str) -> None:
        log.info("pulling image %s", ref)
        started = time.monotonic()
        repository, tag = _split(ref)
        self.client().images.pull(repository, tag=tag)
        self._remember(ref)
        log.info("pulled image %s in %.0fs", ref, time.monotonic() - started)

    def prune(self, keep: frozenset[str] | None = None) -> list[str]:
        """Remove the images this agent pulled that are no longer configured and that no
        container uses; returns their references."""
        keep = self.keep if keep is None else frozenset(keep)
        client = self.client()
        used = {c.attrs.get("Image") for c in client.containers.list(all=True)}
        removed = []
        for ref in sorted(self._book() - keep):
            try:
                image = client.images.get(ref)
            except ImageNotFound:
                self._forget(ref)
                continue
            if image.id in used:
                continue
            client.images.remove(ref)
            self._forget(ref)
            removed.append(ref)
            log.info("pruned image %s (no longer configured, unused)", ref)
        return removed

    def client(self):
        if self._client is None:
            self._client = docker.DockerClient(base_url=self.socket, timeout=3600)
        return self._client

    def _work(self) -> None:
        while True:
            ref = self._queue.get()
            try:
                self.pull(ref)
                self.prune()
            except DockerException as exc:
                log.warning("pulling image %s failed: %s", ref, exc)
                with self._lock:
                    self._failed[ref] = (time.monotonic(), str(exc)[:500])
            except Exception as exc:        # the worker must survive anything
                log.exception("image worker: %s", ref)
                with self._lock:
                    self._failed[ref] = (time.monotonic(), repr(exc)[:500])
            finally:
                with self._lock:
                    self._pending.discard(ref)

    # -- the book of images this agent pulled -------------------------------------------
    def _book(self) -> set[str]:
        with self._lock:
            return set(read_json(self.book_path, {}).get("pulled", []))

    def _remember(self, ref: str) -> None:
        with self._lock:
            pulled = set(read_json(self.book_path, {}).get("pulled", [])) | {ref}
            write_json(self.book_path, {"pulled": sorted(pulled)})

    def _forget(self, ref: str) -> None:
        with self._lock:
            pulled = set(read_json(self.book_path, {}).get("pulled", [])) - {ref}
            write_json(self.book_path, {"pulled": sorted(pulled)})


def _split(ref: str) -> tuple[str, str | None]:
    """`registry:5000/repo:tag` -> (`registry:5000/repo`, `tag`); a digest stays whole."""
    if "@" in ref:
        return ref, None
    repository, _, tag = ref.rpartition(":")
    if not repository or "/" in tag:
        return ref, "latest"
    return repository, tag
