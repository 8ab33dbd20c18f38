"""Host-to-device bandwidth of one GPU, for the burn-in's link check (nodeagent/gpu_checks.py):
copies from pinned host memory, timed by CUDA events on the GPU (not by the host's clock,
which a busy host would slow), through the CUDA driver API by ctypes (`libcuda.so.1`: no
toolkit, no PyTorch), in a process of its own as the GPU memory clear is (a wedged GPU can
hang it; a CUDA context never lives in the agent):

    python -m nodeagent.gpu_bandwidth measure UUID

prints one JSON object {"uuid", "h2d_gbps", "bytes", "copies", "elapsed_ms", "method"}
(or {"error"}) and exits 0 when it measured. `measure()` runs it for the agent."""
import ctypes
import json
import subprocess
import sys

from .gpu_memory import CudaError, _Cuda, _last_json

METHOD = "cuMemcpyHtoDAsync from pinned memory, timed by CUDA events"
BUFFER_BYTES = 256 * 1024 ** 2      # per copy (less on a card with less free memory)
COPIES = 8                          # timed copies after one untimed warm-up copy


def measure_gpu(uuid: str, cuda: _Cuda | None = None) -> dict:
    cuda = cuda or _Cuda()
    device = cuda.devices().get(uuid)
    if device is None:
        raise CudaError(f"no CUDA device with UUID {uuid}")
    ctx = ctypes.c_void_p()
    cuda.check("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), device)
    host, dev, events = ctypes.c_void_p(), ctypes.c_uint64(), []
    try:
        cuda.check("cuCtxSetCurrent", ctx)
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        cuda.check("cuMemGetInfo_v2", ctypes.byref(free), ctypes.byref(total))
        size = min(BUFFER_BYTES, free.value // 2)
        if size < 1024 ** 2:
            raise CudaError(f"only {free.value} bytes free on the GPU")
        cuda.check("cuMemAllocHost_v2", ctypes.byref(host), ctypes.c_size_t(size))
        cuda.check("cuMemAlloc_v2", ctypes.byref(dev), ctypes.c_size_t(size))
        ctypes.memset(host, 0x5A, size)
        for _ in range(2):
            event = ctypes.c_void_p()
            cuda.check("cuEventCreate", ctypes.byref(event), 0)
            events.append(event)
        copy = lambda: cuda.check("cuMemcpyHtoDAsync_v2", dev, host,  # noqa: E731
                                  ctypes.c_size_t(size), None)
        copy()                                          # warm-up: page tables, link speed
        cuda.check("cuEventRecord", events[0], None)
        for _ in range(COPIES):
            copy()
        cuda.check("cuEventRecord", events[1], None)
        cuda.check("cuEventSynchronize", events[1])
        elapsed = ctypes.c_float()
        cuda.check("cuEventElapsedTime", ctypes.byref(elapsed), events[0], events[1])
    finally:
        for event in events:
            cuda.call("cuEventDestroy_v2", event)
        if dev.value:
            cuda.call("cuMemFree_v2", dev)
        if host.value:
            cuda.call("cuMemFreeHost", host)
        cuda.call("cuDevicePrimaryCtxRelease_v2" if hasattr(cuda.lib, "cuDevicePrimaryCtxRelease_v2")
                  else "cuDevicePrimaryCtxRelease", device)
    copied = size * COPIES
    if elapsed.value <= 0:
        raise CudaError("the CUDA events measured no time")
    return {"uuid": uuid, "method": METHOD, "bytes": copied, "copies": COPIES,
            "elapsed_ms": round(elapsed.value, 3),
            "h2d_gbps": round(copied / (elapsed.value / 1000) / 1e9, 2)}


def measure(uuid: str, *, command: list[str] | None = None, timeout: int = 120,
            run=subprocess.run) -> dict:
    """The routine's report for one GPU, or {"error": why}."""
    argv = [part.format(uuid=uuid) for part in command or []] or \
        [sys.executable, "-m", "nodeagent.gpu_bandwidth", "measure", uuid]
    try:
        done = run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"did not finish in {timeout}s"}
    except OSError as exc:
        return {"error": str(exc)[:200]}
    report = _last_json(done.stdout)
    if done.returncode != 0 or not isinstance(report.get("h2d_gbps"), int | float):
        return {"error": str(report.get("error") or (done.stderr or "").strip()[-200:]
                             or f"exit {done.returncode}")}
    return report


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] != ["measure"] or len(argv) != 2:
        print("usage: python -m nodeagent.gpu_bandwidth measure UUID", file=sys.stderr)
        return 64
    try:
        print(json.dumps(measure_gpu(argv[1])))
        return 0
    except CudaError as exc:
        print(json.dumps({"error": str(exc)}))
        return 1


if __name__ == "__main__":
    sys.exit(main())
