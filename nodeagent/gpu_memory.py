"""GPU memory between tenants: a released GPU's memory is overwritten with zeros before the
next lease can have it, and the lease's `key_destroyed` evidence says so per GPU
(`gpu_memory_cleared`, PROTOCOL.md).

Why: a GPU's memory keeps what the last process left in it. Drivers differ in whether a
new allocation is zeroed (AMD and others leaked it across processes, LeftoverLocals
CVE-2023-4969); NVIDIA's driver scrubs in practice but does not promise it. So the agent
does not rely on the driver: once a lease's instance is gone, a separate process fills
each of its GPUs' free memory with zeros and reads a sample back.

The routine runs as a subprocess (a wedged GPU can hang it; a timeout then ends it, and a
CUDA context never lives in the agent): `[gpu_memory] command`, "{uuid}" filled in, or by
default this module's own CUDA driver API routine through ctypes (`libcuda.so.1`, part of
the NVIDIA driver: no toolkit, no PyTorch). A command prints one JSON object on its last
line: {"method", "bytes", "total_bytes", "verified", "samples", "nonzero"}; exit 0 only
when the memory read back as written.

A failed or impossible clear is recorded, never hidden: the evidence carries
`"result": "failed"` with the reason (the storefront quarantines the node, as after a
failed disk wipe), and the GPU stays marked until a clear succeeds, so its next burn-in
fails rather than pass a card with a tenant's data in it (nodeagent/burnin.py).

Why and how: docs/adr/0005-gpu-memory-between-tenants.md. Proving it on a real GPU needs
a GPU (nodeagent/README.md); the tests run the same routine against a stub libcuda
(tests/nodeagent/cuda_stub)."""
import ctypes
import json
import logging
import random
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from .journal import utc_now
from .state import read_json, write_json

log = logging.getLogger(__name__)

METHOD = "cuda-memset-zero"
CHUNK_BYTES = 256 * 1024 ** 2       # allocation size while memory lasts (fewer calls)
MIN_CHUNK_BYTES = 64 * 1024         # then halved down to this: the remainder is taken too
SAMPLE_BYTES = 4096                 # read back per sample
RANDOM_SAMPLES_PER_CHUNK = 2        # beside each chunk's first and last bytes
CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY = 0, 2
MAX_DETAIL = 300


@dataclass
class GpuMemoryConfig:
    command: list[str] = field(default_factory=list)   # [] = this module's CUDA routine
    timeout_seconds: int = 300      # one GPU's clear; a wedged GPU is then reported failed


class GpuMemory:
    """Which GPUs each lease used on this node (`hold`, before its instance starts) and
    their clearing once the instance is gone (`release`). Kept in a state file of its own,
    so a restart between the two still clears: converge and the burn-in worker share it."""

    def __init__(self, config: GpuMemoryConfig, path, run=subprocess.run):
        self.config, self.path, self._run = config, path, run
        self._lock = threading.Lock()
        data = read_json(path, {})
        self._held: dict[str, list[str]] = data.get("held", {})
        self._cleared: dict[str, dict] = data.get("cleared", {})
        self._dirty: dict[str, str] = data.get("dirty", {})   # uuid -> why it is not clean

    def hold(self, lease_id: int, uuids) -> None:
        """Every GPU the lease's instance gets, before it starts (the set only grows:
        a GPU it had before a spec change held its data too). A GPU cleared after an
        earlier instance of the lease (it moved away and came back) is to be cleared again."""
        with self._lock:
            held = self._held.get(str(lease_id), [])
            new = [u for u in uuids if u not in held]
            cleared = self._cleared.get(str(lease_id), {})
            stale = [u for u in uuids if u in cleared]
            for uuid in stale:
                del cleared[uuid]
            if new or stale:
                self._held[str(lease_id)] = held + new
                self._save()

    def release(self, lease_id: int, *, in_use: dict[str, int] | None = None) -> dict:
        """Clear each GPU the lease held and was not cleared yet; returns the lease's
        results. `in_use`: GPUs another running instance has (uuid -> its lease): their
        memory is that tenant's now, so the clear came too late and is recorded failed."""
        with self._lock:
            held = list(self._held.get(str(lease_id), []))
            results = self._cleared.setdefault(str(lease_id), {})
        todo = [uuid for uuid in held if uuid not in results]
        # one process per GPU, side by side: an 8-GPU lease's release waits for one clear
        with ThreadPoolExecutor(max_workers=max(len(todo), 1)) as pool:
            cleared = dict(zip(todo, pool.map(lambda uuid: self._clear_unless_taken(uuid, in_use), todo), strict=True))
        for uuid, entry in cleared.items():
            with self._lock:
                results[uuid] = entry
                self._mark(uuid, entry)
                self._save()
            log.log(logging.INFO if entry["result"] == "ok" else logging.ERROR,
                    "lease %s: GPU %s memory %s (%s)", lease_id, uuid,
                    "cleared" if entry["result"] == "ok" else "NOT cleared",
                    entry.get("detail") or f"{entry['bytes']} bytes")
        with self._lock:
            self._held.pop(str(lease_id), None)
            self._save()
            return dict(results)

    def _clear_unless_taken(self, uuid: str, in_use: dict[str, int] | None) -> dict:
        if in_use and uuid in in_use:
            return _failed(f"lease {in_use[uuid]}'s instance had this GPU before it was cleared")
        return self.clear(uuid)

    def results(self, lease_id: int) -> dict:
        """What the evidence says: {uuid: {result, method, bytes, total_bytes, verified, …}}."""
        with self._lock:
            return {u: dict(e) for u, e in self._cleared.get(str(lease_id), {}).items()}

    def not_clean(self, uuid: str) -> str:
        """Why a GPU may not be handed on ("" when it may): a GPU whose last clear failed
        is cleared again first."""
        with self._lock:
            if uuid not in self._dirty:
                return ""
        entry = self.clear(uuid)
        with self._lock:
            self._mark(uuid, entry)
            self._save()
            return self._dirty.get(uuid, "")

    def forget(self, lease_id: int) -> None:
        with self._lock:
            if self._cleared.pop(str(lease_id), None) is not None:
                self._save()

    def clear(self, uuid: str) -> dict:
        argv = ([part.format(uuid=uuid) for part in self.config.command] or
                [sys.executable, "-m", "nodeagent.gpu_memory", "clear", uuid])
        try:
            done = self._run(argv, capture_output=True, text=True,
                             timeout=self.config.timeout_seconds)
        except subprocess.TimeoutExpired:
            return _failed(f"{argv[0]} did not finish in {self.config.timeout_seconds}s")
        except OSError as exc:
            return _failed(f"{argv[0]}: {exc}")
        report = _last_json(done.stdout)
        entry = {"result": "failed", "method": str(report.get("method") or "?")[:40],
                 "bytes": _count(report.get("bytes")), "total_bytes": _count(report.get("total_bytes")),
                 "verified": report.get("verified") is True, "at": utc_now()}
        if done.returncode == 0 and entry["verified"] and entry["bytes"] > 0:
            entry["result"] = "ok"
        else:
            why = report.get("error") or (done.stderr or "").strip()[-MAX_DETAIL:] or \
                f"exit {done.returncode}, {report.get('nonzero', '?')} non-zero bytes read back"
            entry["detail"] = str(why)[:MAX_DETAIL]
        return entry

    def _mark(self, uuid: str, entry: dict) -> None:
        if entry["result"] == "ok":
            self._dirty.pop(uuid, None)
        else:
            self._dirty[uuid] = entry.get("detail") or "not cleared"

    def _save(self) -> None:
        write_json(self.path, {"held": self._held, "cleared": self._cleared, "dirty": self._dirty})


def _failed(detail: str) -> dict:
    return {"result": "failed", "method": METHOD, "bytes": 0, "total_bytes": 0,
            "verified": False, "at": utc_now(), "detail": detail[:MAX_DETAIL]}


def _last_json(stdout: str) -> dict:
    for line in reversed((stdout or "").strip().splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        return value if isinstance(value, dict) else {}
    return {}


def _count(value) -> int:
    return value if type(value) is int and value >= 0 else 0


# -- the routine (runs in its own process: `python -m nodeagent.gpu_memory clear UUID`) ----
class CudaError(Exception):
    pass


class _Cuda:
    """The few CUDA driver API calls the routine needs, through ctypes."""

    def __init__(self, library: str = "libcuda.so.1"):
        try:
            self.lib = ctypes.CDLL(library)
        except OSError as exc:
            raise CudaError(f"cannot load {library}: {exc}") from None
        self.check("cuInit", 0)

    def call(self, name: str, *args) -> int:
        return getattr(self.lib, name)(*args)

    def check(self, name: str, *args) -> None:
        code = self.call(name, *args)
        if code != CUDA_SUCCESS:
            raise CudaError(f"{name} failed with CUDA error {code}")

    def devices(self) -> dict[str, int]:
        count = ctypes.c_int()
        self.check("cuDeviceGetCount", ctypes.byref(count))
        found = {}
        get_uuid = "cuDeviceGetUuid_v2" if hasattr(self.lib, "cuDeviceGetUuid_v2") else "cuDeviceGetUuid"
        for ordinal in range(count.value):
            device, raw = ctypes.c_int(), (ctypes.c_ubyte * 16)()
            self.check("cuDeviceGet", ctypes.byref(device), ordinal)
            self.check(get_uuid, raw, device)
            found[_uuid_text(bytes(raw))] = device.value
        return found


def _uuid_text(raw: bytes) -> str:
    """NVML's spelling of a GPU UUID from CUDA's 16 bytes."""
    h = raw.hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def clear_gpu(uuid: str, cuda: _Cuda | None = None) -> dict:
    """Allocate every byte of the GPU's free memory, write zeros over it, read a sample of
    each allocation back, free it. What stays out of reach (the driver's own reservation,
    this context's) is `total_bytes - bytes`, shown in the record."""
    cuda = cuda or _Cuda()
    device = cuda.devices().get(uuid)
    if device is None:
        raise CudaError(f"no CUDA device with UUID {uuid}")
    ctx = ctypes.c_void_p()
    cuda.check("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), device)
    chunks: list[tuple[int, int]] = []
    try:
        cuda.check("cuCtxSetCurrent", ctx)
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        cuda.check("cuMemGetInfo_v2", ctypes.byref(free), ctypes.byref(total))
        size = CHUNK_BYTES
        while size >= MIN_CHUNK_BYTES:
            pointer = ctypes.c_uint64()
            code = cuda.call("cuMemAlloc_v2", ctypes.byref(pointer), ctypes.c_size_t(size))
            if code == CUDA_SUCCESS:
                chunks.append((pointer.value, size))
            elif code == CUDA_ERROR_OUT_OF_MEMORY:
                size //= 2
            else:
                raise CudaError(f"cuMemAlloc_v2 failed with CUDA error {code}")
        for pointer, length in chunks:
            cuda.check("cuMemsetD8_v2", ctypes.c_uint64(pointer), ctypes.c_ubyte(0),
                       ctypes.c_size_t(length))
        cuda.check("cuCtxSynchronize")
        samples, nonzero = _read_back(cuda, chunks)
    finally:
        for pointer, _ in chunks:
            cuda.call("cuMemFree_v2", ctypes.c_uint64(pointer))
        release = ("cuDevicePrimaryCtxRelease_v2" if hasattr(cuda.lib, "cuDevicePrimaryCtxRelease_v2")
                   else "cuDevicePrimaryCtxRelease")
        cuda.call(release, device)
    cleared = sum(length for _, length in chunks)
    return {"uuid": uuid, "method": METHOD, "bytes": cleared, "total_bytes": total.value,
            "free_bytes_before": free.value, "samples": samples, "nonzero": nonzero,
            "verified": samples > 0 and nonzero == 0 and cleared > 0}


def _read_back(cuda: _Cuda, chunks: list[tuple[int, int]]) -> tuple[int, int]:
    buffer = (ctypes.c_ubyte * SAMPLE_BYTES)()
    samples = nonzero = 0
    for pointer, length in chunks:
        span = max(length - SAMPLE_BYTES, 0)
        offsets = {0, span, *(random.randrange(span + 1) for _ in range(RANDOM_SAMPLES_PER_CHUNK))}
        for offset in sorted(offsets):
            n = min(SAMPLE_BYTES, length - offset)
            cuda.check("cuMemcpyDtoH_v2", buffer, ctypes.c_uint64(pointer + offset), ctypes.c_size_t(n))
            data = bytes(buffer)[:n]
            samples += 1
            nonzero += n - data.count(0)
    return samples, nonzero


def main(argv: list[str] | None = None) -> int:
    """`clear UUID`: the JSON report on stdout, exit 0 when verified. `count`: how many
    CUDA devices this process sees (the agent's start check)."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv[:1] == ["count"]:
            print(len(_Cuda().devices()))
            return 0
        if argv[:1] == ["clear"] and len(argv) == 2:
            report = clear_gpu(argv[1])
            print(json.dumps(report))
            return 0 if report["verified"] else 1
    except CudaError as exc:
        print(json.dumps({"method": METHOD, "verified": False, "error": str(exc)}))
        print(str(exc), file=sys.stderr)
        return 1
    print("usage: python -m nodeagent.gpu_memory clear UUID | count", file=sys.stderr)
    return 64


if __name__ == "__main__":
    sys.exit(main())
