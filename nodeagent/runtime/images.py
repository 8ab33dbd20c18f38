"""Image pulls beside the converge loop: a multi-GB pull for one lease must not
delay the reports or the other leases' operations. A lease whose image is missing asks for
a pull and reports `image_pulling` (with the bytes done so far) until it is there; one
worker thread pulls, one image at a time (the node's uplink is the bottleneck), with its
own Docker client.

A customer's image (desired item `image_ref`, docs/adr/0014-customer-images-and-ssh.md)
comes with the lease's registry credentials when it is private. They live only in this
process's memory, in the queue entry of the pull that uses them: never logged, never in
the state directory. Each customer image is pulled once per agent process and
credentials, even when it is on the node already, so a private image pulled for one
lease is never handed to another without the registry agreeing.

A failed pull is named (`image_not_found`, `registry_auth_failed`, `image_too_large`,
`image_no_shell`, else `image_missing`) and not tried again before a back-off that doubles
with each failure (`[docker] pull_retry_seconds` up to `pull_retry_max_seconds`); new
credentials are a new attempt at once.

Only images this agent pulled are ever pruned (the book in `<state>/runtime/images.json`):
once no longer configured in `[images]`, used by no container and not asked for within
`keep_seconds`. An image the operator loaded by hand is never touched."""
import hashlib
import json
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import docker
from docker import auth as docker_auth
from docker.errors import APIError, DockerException, ImageNotFound, NotFound
from docker.utils.json_stream import json_stream

from ..interfaces import OperationFailed
from ..state import read_json, write_json

log = logging.getLogger(__name__)
PULL_RETRY_SECONDS = 300        # the default first back-off after a failed pull
PULL_RETRY_MAX_SECONDS = 3600
KEEP_SECONDS = 24 * 3600        # a customer image asked for lately is not pruned
LAYER_DONE = ("Verifying Checksum", "Download complete", "Extracting", "Pull complete")
LAYER_STATUSES = ("Pulling fs layer", "Waiting", "Downloading", "Already exists", *LAYER_DONE)
SHELL = "/bin/sh"               # the launcher, the start command and SSH sessions need it

@dataclass
class Progress:
    """Bytes of a running pull, summed over its layers (as dockerd reports them)."""
    layers: dict[str, tuple[int, int]] = field(default_factory=dict)   # id -> (done, total)

    def update(self, event: dict) -> None:
        layer, status = event.get("id"), str(event.get("status") or "")
        if not layer or status not in LAYER_STATUSES or status == "Already exists":
            return             # a line about the whole pull, or a layer not downloaded
        done, total = self.layers.get(layer, (0, 0))
        detail = event.get("progressDetail") or {}
        if status == "Downloading" and detail.get("total"):
            total = max(total, int(detail["total"]))
            done = min(max(done, int(detail.get("current") or 0)), total)
        elif status in LAYER_DONE:
            done = total
        self.layers[layer] = (done, total)

    @property
    def total(self) -> int:
        return sum(total for _, total in self.layers.values())

    def report(self) -> dict:
        return {"done_bytes": sum(done for done, _ in self.layers.values()),
                "total_bytes": self.total}


@dataclass(frozen=True)
class PullRequest:
    ref: str
    auth: dict | None = field(default=None, repr=False, compare=False)
    max_bytes: int = 0
    verify: bool = False       # a customer image: pulled even when present (see the module)


def auth_key(auth: dict | None) -> str:
    """Which credentials a pull used, as a one-way digest (for the in-memory book only)."""
    if not auth:
        return ""
    return hashlib.sha256(json.dumps(auth, sort_keys=True).encode()).hexdigest()[:16]


def classify(message: str, *, with_auth: bool) -> tuple[str, str]:
    """dockerd's error text -> (contract error code, a message a customer can act on)."""
    text = message.lower()
    if "repository does not exist or may require" in text:
        # Docker Hub answers so for a missing repository and for a private one alike
        if with_auth:
            return "registry_auth_failed", ("the registry refused these credentials, or the "
                                            "repository does not exist")
        return "image_not_found", ("no such image, or it is private: give the registry "
                                   "credentials with the image")
    if any(word in text for word in ("unauthorized", "authentication required", "401",
                                     "no basic auth credentials",
                                     "403", "forbidden", "denied", "incorrect username")):
        return "registry_auth_failed", ("the registry refused the credentials" if with_auth else
                                        "the registry requires credentials for this image")
    if any(word in text for word in ("manifest unknown", "not found", "404", "name unknown",
                                     "invalid reference", "no matching manifest",
                                     "no such host")):
        return "image_not_found", "no such image in the registry (check its name and tag)"
    return "image_missing", "pulling the image failed"


class ImagePuller:
    def __init__(self, socket: str, book_path: Path, *, keep: frozenset[str] = frozenset(),
                 retry_seconds: float = PULL_RETRY_SECONDS,
                 retry_max_seconds: float = PULL_RETRY_MAX_SECONDS,
                 keep_seconds: float = KEEP_SECONDS):
        self.socket, self.book_path, self.keep = socket, Path(book_path), frozenset(keep)
        self.retry_seconds, self.retry_max_seconds = retry_seconds, retry_max_seconds
        self.keep_seconds = keep_seconds
        self._queue: queue.Queue[PullRequest] = queue.Queue()
        self._lock = threading.Lock()
        self._pending: set[str] = set()
        # (ref, auth_key) -> (when, how many in a row, code, message)
        self._failed: dict[tuple[str, str], tuple[float, int, str, str]] = {}
        self._progress: dict[str, Progress] = {}
        self._verified: set[tuple[str, str]] = set()
        self._asked: dict[str, float] = {}
        self._thread: threading.Thread | None = None
        self._client = None

    # -- from the converge loop ------------------------------------------------------------
    def request(self, ref: str, *, auth: dict | None = None, max_bytes: int = 0,
                verify: bool = False) -> None:
        """Queue a pull of `ref` (once: a pull already queued or running is not repeated)."""
        with self._lock:
            self._asked[ref] = time.monotonic()
            if ref in self._pending:
                return
            self._pending.add(ref)
            self._progress[ref] = Progress()
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._work, name="image-puller",
                                                daemon=True)
                self._thread.start()
        self._queue.put(PullRequest(ref, auth, max_bytes, verify))

    def pulling(self, ref: str) -> bool:
        with self._lock:
            return ref in self._pending

    def progress(self, ref: str) -> dict | None:
        """{"done_bytes", "total_bytes"} of the pull of `ref` under way, else None."""
        with self._lock:
            if ref not in self._pending or ref not in self._progress:
                return None
            return self._progress[ref].report()

    def verified(self, ref: str, auth: dict | None) -> bool:
        """Whether this process pulled `ref` with these credentials (a customer image)."""
        with self._lock:
            self._asked[ref] = time.monotonic()
            return (ref, auth_key(auth)) in self._verified

    def failure(self, ref: str, auth: dict | None = None) -> tuple[str, str] | None:
        """(code, message) of the last failed pull of `ref` with these credentials, while it
        is too early to try again (the back-off doubles with each failure in a row)."""
        with self._lock:
            failed = self._failed.get((ref, auth_key(auth)))
            if failed is None:
                return None
            when, count, code, message = failed
            if time.monotonic() - when < self.backoff(count):
                return code, message
            return None

    def backoff(self, failures: int) -> float:
        return min(self.retry_seconds * 2 ** max(failures - 1, 0), self.retry_max_seconds)

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
    def pull(self, ref: str, *, auth: dict | None = None, max_bytes: int = 0) -> None:
        """Pull `ref` (streaming: progress kept; aborted once the layers' total passes
        `max_bytes`), then check it; OperationFailed with a contract code on failure."""
        log.info("pulling image %s%s", ref, " (with registry credentials)" if auth else "")
        started = time.monotonic()
        with self._lock:
            progress = self._progress.setdefault(ref, Progress())
        repository, tag = _split(ref)
        client = self.client()
        try:
            self._stream(client, repository, tag, auth, progress, max_bytes)
        except OperationFailed:
            raise
        except DockerException as exc:
            raise self._failed_pull(ref, _explanation(exc), auth) from None
        self._check(client, ref, max_bytes)
        self._remember(ref)
        log.info("pulled image %s in %.0fs", ref, time.monotonic() - started)

    def _stream(self, client, repository, tag, auth, progress: Progress, max_bytes: int) -> None:
        api = client.api
        headers = {}
        if auth:
            headers["X-Registry-Auth"] = docker_auth.encode_header(
                {"username": auth.get("username", ""), "password": auth.get("password", ""),
                 "serveraddress": auth.get("server", "")})
        params = {"fromImage": repository, "tag": tag}
        # The low-level call (what APIClient.pull does), so that the response can be closed:
        # dockerd cancels a pull whose client went away (the size limit).
        response = api._post(api._url("/images/create"), params=params, headers=headers,
                             stream=True, timeout=None)
        try:
            api._raise_for_status(response)
            for event in json_stream(api._stream_helper(response, decode=False)):
                if event.get("error"):
                    raise self._failed_pull(f"{repository}:{tag}", str(event["error"]), auth)
                with self._lock:
                    progress.update(event)
                    total = progress.total
                if max_bytes and total > max_bytes:
                    raise OperationFailed("image_too_large", _too_large(total, max_bytes))
        finally:
            response.close()

    def _check(self, client, ref: str, max_bytes: int) -> None:
        """The pulled image's own size (uncompressed) and its shell; removed if it fails."""
        image = client.images.get(ref)
        size = int(image.attrs.get("Size") or 0)
        problem = None
        if max_bytes and size > max_bytes:
            problem = OperationFailed("image_too_large", _too_large(size, max_bytes))
        elif not has_shell(client, image.id):
            problem = OperationFailed("image_no_shell", f"the image has no {SHELL}: it is "
                                      "needed to start SSH and the start command")
        if problem is not None:
            self._remove_image(client, ref)
            raise problem

    def prune(self, keep: frozenset[str] | None = None) -> list[str]:
        """Remove the images this agent pulled that are no longer configured, not asked for
        lately and that no container uses; returns their references."""
        keep = self.keep if keep is None else frozenset(keep)
        with self._lock:
            recent = {ref for ref, when in self._asked.items()
                      if time.monotonic() - when < self.keep_seconds} | set(self._pending)
        client = self.client()
        used = {c.attrs.get("Image") for c in client.containers.list(all=True)}
        removed = []
        for ref in sorted(self._book() - keep - recent):
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
            wanted = self._queue.get()
            key = (wanted.ref, auth_key(wanted.auth))
            try:
                self.pull(wanted.ref, auth=wanted.auth, max_bytes=wanted.max_bytes)
                with self._lock:
                    self._failed.pop(key, None)
                    if wanted.verify:
                        self._verified.add(key)
                self.prune()
            except OperationFailed as exc:
                self._note_failure(key, exc.code, exc.detail)
            except DockerException as exc:
                self._note_failure(key, "image_missing", f"pulling the image failed: {_explanation(exc)}")
            except Exception as exc:        # the worker must survive anything
                log.exception("image worker: %s", wanted.ref)
                self._note_failure(key, "image_missing", f"pulling the image failed: {exc!r}"[:500])
            finally:
                with self._lock:
                    self._pending.discard(wanted.ref)
                    self._progress.pop(wanted.ref, None)
                del wanted                 # the credentials go with the request

    def _note_failure(self, key: tuple[str, str], code: str, message: str) -> None:
        with self._lock:
            count = self._failed.get(key, (0, 0, "", ""))[1] + 1
            self._failed[key] = (time.monotonic(), count, code, message[:500])
            delay = self.backoff(count)
        log.warning("pulling image %s failed (%s, next try in %.0fs): %s", key[0], code, delay,
                    message[:500])

    def _failed_pull(self, ref: str, message: str, auth: dict | None) -> OperationFailed:
        code, human = classify(message, with_auth=bool(auth))
        # dockerd's own words, cut short: they name the reference, never the credentials
        return OperationFailed(code, f"{human}: {ref} ({message.strip()[:300]})")

    def _remove_image(self, client, ref: str) -> None:
        """A pulled image that failed its checks goes (unless configured or in use)."""
        if ref in self.keep:
            return
        try:
            image = client.images.get(ref)
        except ImageNotFound:
            return
        if image.id in {c.attrs.get("Image") for c in client.containers.list(all=True)}:
            return
        try:
            client.images.remove(ref, force=True)
        except (NotFound, APIError):
            pass
        self._forget(ref)

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


def has_shell(client, image_id: str) -> bool:
    """Whether the image holds /bin/sh (a file, or a link to one inside the image), read
    from a created, never started container."""
    container = client.containers.create(image_id, command=[SHELL], network_disabled=True)
    try:
        target = SHELL
        for _ in range(8):                  # follow a few links (dash, busybox, bash)
            try:
                stat = client.api.get_archive(container.id, target)[1]
            except NotFound:
                return False
            if not stat.get("linkTarget"):
                return True
            link = stat["linkTarget"]
            target = link if link.startswith("/") else f"{target.rsplit('/', 1)[0]}/{link}"
        return True
    finally:
        container.remove(force=True)


def _too_large(size: int, limit: int) -> str:
    return (f"the image is larger than this offer allows ({size / 1e9:.1f} GB over "
            f"{limit / 1e9:.1f} GB uncompressed)")


def _explanation(exc: DockerException) -> str:
    if isinstance(exc, APIError):
        return str(exc.explanation or exc)
    return str(exc)


def _split(ref: str) -> tuple[str, str | None]:
    """`registry:5000/repo:tag` -> (`registry:5000/repo`, `tag`); a digest stays whole."""
    if "@" in ref:
        return ref, None
    repository, _, tag = ref.rpartition(":")
    if not repository or "/" in tag:
        return ref, "latest"
    return repository, tag
