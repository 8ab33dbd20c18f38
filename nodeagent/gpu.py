"""GPU inventory and health through NVML (`pynvml` from nvidia-ml-py). A host without
libnvidia-ml (or whose driver is not loaded) is the clear state `library = "none"` with no
GPUs, never a crash."""
import logging
from dataclasses import dataclass

from .interfaces import GpuInfo

log = logging.getLogger(__name__)

# Xid codes that mean the card needs an operator (NVIDIA's Xid catalogue): double-bit
# ECC, fallen off the bus, row-remap failure, uncontained memory errors, GSP/NVLink faults.
CRITICAL_XIDS = frozenset({48, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140})
XID_EVENT = 0x0000000000000008       # nvmlEventTypeXidCriticalError


class NoGpuProbe:
    library = "none"

    def __init__(self, reason: str = ""):
        self.reason = reason

    def inventory(self) -> list[GpuInfo]:
        return []


@dataclass
class _Device:
    index: int
    handle: object


class NvmlProbe:
    """Keeps NVML initialised for the agent's lifetime, so Xid events that arrive between
    two reports are collected by the event set (best effort: not every GPU or driver
    supports events)."""
    library = "nvml"

    def __init__(self, pynvml, *, max_temperature_c: int = 90):
        self.nvml = pynvml
        self.max_temperature_c = max_temperature_c
        self.devices = [_Device(i, pynvml.nvmlDeviceGetHandleByIndex(i))
                        for i in range(pynvml.nvmlDeviceGetCount())]
        self.xids: dict[int, list[int]] = {d.index: [] for d in self.devices}
        self.uuids = {d.index: self._text(pynvml.nvmlDeviceGetUUID(d.handle))
                      for d in self.devices}
        self.events = self._register_xid_events()

    def inventory(self) -> list[GpuInfo]:
        self._drain_xid_events()
        driver = self._text(self._best_effort(self.nvml.nvmlSystemGetDriverVersion) or "")
        cuda = self._cuda_version()
        return [self._safe_info(device, driver, cuda) for device in self.devices]

    def _safe_info(self, device: _Device, driver: str, cuda: str) -> GpuInfo:
        """A card NVML can no longer read (fallen off the bus, …) is reported unhealthy."""
        try:
            return self._info(device, driver, cuda)
        except self.nvml.NVMLError as exc:
            return GpuInfo(index=device.index, uuid=self.uuids.get(device.index, ""), name="",
                           memory_mb=0, driver=driver, cuda=cuda, temperature_c=None,
                           ecc_uncorrected=0, xid_errors=tuple(self.xids[device.index]),
                           healthy=False, problem=f"NVML cannot read this GPU: {exc}")

    def _info(self, device: _Device, driver: str, cuda: str) -> GpuInfo:
        nvml, handle = self.nvml, device.handle
        temperature = self._best_effort(nvml.nvmlDeviceGetTemperature, handle,
                                        nvml.NVML_TEMPERATURE_GPU)
        ecc = self._best_effort(nvml.nvmlDeviceGetTotalEccErrors, handle,
                                nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                nvml.NVML_VOLATILE_ECC) or 0
        xids = tuple(self.xids[device.index])
        problem = self._problem(temperature, ecc, xids)
        return GpuInfo(
            index=device.index,
            uuid=self._text(nvml.nvmlDeviceGetUUID(handle)),
            name=self._text(nvml.nvmlDeviceGetName(handle)),
            memory_mb=nvml.nvmlDeviceGetMemoryInfo(handle).total // (1024 * 1024),
            driver=driver, cuda=cuda, temperature_c=temperature, ecc_uncorrected=ecc,
            xid_errors=xids, healthy=not problem, problem=problem)

    def _problem(self, temperature: int | None, ecc: int, xids: tuple[int, ...]) -> str:
        problems = []
        if ecc:
            problems.append(f"{ecc} uncorrected ECC errors")
        if temperature is not None and temperature >= self.max_temperature_c:
            problems.append(f"temperature {temperature} C >= {self.max_temperature_c} C")
        critical = sorted(set(xids) & CRITICAL_XIDS)
        if critical:
            problems.append("critical Xid " + ", ".join(map(str, critical)))
        return "; ".join(problems)

    def _cuda_version(self) -> str:
        version = self._best_effort(self.nvml.nvmlSystemGetCudaDriverVersion)
        return f"{version // 1000}.{version % 1000 // 10}" if version else ""

    def _register_xid_events(self):
        try:
            events = self.nvml.nvmlEventSetCreate()
            for device in self.devices:
                self.nvml.nvmlDeviceRegisterEvents(device.handle, XID_EVENT, events)
            return events
        except self.nvml.NVMLError as exc:
            log.info("Xid events unavailable (%s); reporting ECC and temperature only", exc)
            return None

    def _drain_xid_events(self) -> None:
        if self.events is None:
            return
        by_handle = {self._handle_key(d.handle): d.index for d in self.devices}
        for _ in range(1000):
            try:
                event = self.nvml.nvmlEventSetWait_v2(self.events, 0)
            except self.nvml.NVMLError:    # NVML_ERROR_TIMEOUT: nothing pending
                return
            index = by_handle.get(self._handle_key(event.device))
            if index is not None and event.eventType & XID_EVENT:
                self.xids[index] = (self.xids[index] + [int(event.eventData)])[-20:]

    @staticmethod
    def _handle_key(handle) -> int:
        import ctypes
        return ctypes.cast(handle, ctypes.c_void_p).value or 0

    def _best_effort(self, fn, *args):
        try:
            return fn(*args)
        except self.nvml.NVMLError as exc:
            log.debug("%s unavailable: %s", fn.__name__, exc)
            return None

    @staticmethod
    def _text(value) -> str:
        return value.decode() if isinstance(value, bytes) else str(value)


def open_gpu_probe(*, max_temperature_c: int = 90):
    """NVML when the library and driver answer, else the explicit no-GPU probe."""
    try:
        import pynvml
    except ImportError:
        return NoGpuProbe("nvidia-ml-py is not installed")
    try:
        pynvml.nvmlInit()
        return NvmlProbe(pynvml, max_temperature_c=max_temperature_c)
    except pynvml.NVMLError as exc:
        log.warning("no GPU library: %s", exc)
        return NoGpuProbe(str(exc))


def gpu_report(info: GpuInfo) -> dict:
    return {"index": info.index, "uuid": info.uuid, "name": info.name,
            "memory_mb": info.memory_mb, "driver": info.driver, "cuda": info.cuda,
            "temperature_c": info.temperature_c, "ecc_uncorrected": info.ecc_uncorrected,
            "xid_errors": list(info.xid_errors), "healthy": info.healthy,
            "problem": info.problem}
