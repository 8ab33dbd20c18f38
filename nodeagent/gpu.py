"""GPU inventory and health through NVML (`pynvml` from nvidia-ml-py). A host without
libnvidia-ml (or whose driver is not loaded) is the clear state `library = "none"` with no
GPUs, never a crash."""
import logging
import threading
from dataclasses import dataclass, replace

from .health import FABRIC_STATES, Condition, conditions_for, legacy_verdict
from .interfaces import GpuInfo

log = logging.getLogger(__name__)

XID_EVENT = 0x0000000000000008       # nvmlEventTypeXidCriticalError
NVLINK_CRC_FLIT = 2                  # NVML_NVLINK_ERROR_DL_CRC_FLIT
NVLINK_P2P = 2                       # NVML_P2P_CAPS_INDEX_NVLINK
MAX_NVLINKS = 18                     # per GPU on current parts (NVML allows 36)


class NoGpuProbe:
    library = "none"

    def __init__(self, reason: str = ""):
        self.reason = reason

    def inventory(self) -> list[GpuInfo]:
        return []

    def telemetry(self) -> list[dict]:
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

    def __init__(self, pynvml, *, max_temperature_c: int = 90, min_cuda: str = ""):
        self.nvml = pynvml
        self.max_temperature_c = max_temperature_c
        self.min_cuda = min_cuda
        self.devices = [_Device(i, pynvml.nvmlDeviceGetHandleByIndex(i))
                        for i in range(pynvml.nvmlDeviceGetCount())]
        self.xids: dict[int, list[int]] = {d.index: [] for d in self.devices}
        # Xids not yet taken by the telemetry sampler (each event once, in order; bounded)
        self.xid_new: dict[int, list[int]] = {d.index: [] for d in self.devices}
        self.uuids = {d.index: self._text(pynvml.nvmlDeviceGetUUID(d.handle))
                      for d in self.devices}
        self.crc_seen: dict[int, int] = {}
        self._lock = threading.Lock()
        self.events = self._register_xid_events()

    def inventory(self) -> list[GpuInfo]:
        with self._lock:        # the loop and the burn-in worker both read the cards
            return self._inventory()

    def _inventory(self) -> list[GpuInfo]:
        self._drain_xid_events()
        driver = self._text(self._best_effort(self.nvml.nvmlSystemGetDriverVersion) or "")
        cuda = self._cuda_version()
        infos = [self._safe_info(device, driver, cuda) for device in self.devices]
        return self._with_conditions(infos, self._nvlink_peers())

    def _with_conditions(self, infos: list[GpuInfo], peers: dict[int, list[int]]) -> list[GpuInfo]:
        """Conditions need the whole node: a GPU with fewer active NVLinks than its
        neighbours has a link down."""
        node_max_links = max(((i.readings.get("nvlink") or {}).get("active", 0) for i in infos),
                             default=0)
        out = []
        for info in infos:
            readings = {**info.readings, "nvlink_peers": peers.get(info.index, [])}
            found = list(info.conditions) or conditions_for(
                readings, max_temperature_c=self.max_temperature_c,
                node_max_links=node_max_links, min_cuda=self.min_cuda)
            healthy, problem = legacy_verdict(found)
            out.append(replace(info, readings=readings, conditions=tuple(found),
                               healthy=healthy, problem=problem))
        return out

    def _nvlink_peers(self) -> dict[int, list[int]]:
        """Which GPUs each one reaches over NVLink (peer-to-peer status), for the buyer's
        topology and the recommendation's link rule."""
        peers: dict[int, list[int]] = {d.index: [] for d in self.devices}
        for a in self.devices:
            for b in self.devices:
                if a.index != b.index and self._best_effort(
                        self.nvml.nvmlDeviceGetP2PStatus, a.handle, b.handle, NVLINK_P2P) == 0:
                    peers[a.index].append(b.index)
        return peers

    def _safe_info(self, device: _Device, driver: str, cuda: str) -> GpuInfo:
        """A card NVML can no longer read (fallen off the bus, …) is reported unhealthy."""
        try:
            return self._info(device, driver, cuda)
        except self.nvml.NVMLError as exc:
            lost = Condition("gpu_lost", f"NVML cannot read this GPU: {exc}")
            return GpuInfo(index=device.index, uuid=self.uuids.get(device.index, ""), name="",
                           memory_mb=0, driver=driver, cuda=cuda, temperature_c=None,
                           ecc_uncorrected=0, xid_errors=tuple(self.xids[device.index]),
                           healthy=False, problem=lost.detail, conditions=(lost,))

    def _info(self, device: _Device, driver: str, cuda: str) -> GpuInfo:
        nvml, handle = self.nvml, device.handle
        temperature = self._best_effort(nvml.nvmlDeviceGetTemperature, handle,
                                        nvml.NVML_TEMPERATURE_GPU)
        ecc = self._best_effort(nvml.nvmlDeviceGetTotalEccErrors, handle,
                                nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                nvml.NVML_VOLATILE_ECC) or 0
        xids = tuple(self.xids[device.index])
        return GpuInfo(
            index=device.index,
            uuid=self._text(nvml.nvmlDeviceGetUUID(handle)),
            name=self._text(nvml.nvmlDeviceGetName(handle)),
            memory_mb=nvml.nvmlDeviceGetMemoryInfo(handle).total // (1024 * 1024),
            driver=driver, cuda=cuda, temperature_c=temperature, ecc_uncorrected=ecc,
            xid_errors=xids, healthy=True,
            readings={"ecc_uncorrected": ecc, "temperature_c": temperature, "xid_errors": xids,
                      "cuda": cuda, **self._health_readings(device)})

    def _health_readings(self, device: _Device) -> dict:
        """Everything beyond ECC; each reading is absent (None) where the card or driver
        does not support it, never a failure."""
        nvml, handle = self.nvml, device.handle
        remap = self._best_effort(nvml.nvmlDeviceGetRemappedRows, handle)
        mig = self._best_effort(nvml.nvmlDeviceGetMigMode, handle)
        pcie = {name: self._best_effort(getattr(nvml, fn), handle) for name, fn in (
            ("gen", "nvmlDeviceGetCurrPcieLinkGeneration"),
            ("max_gen", "nvmlDeviceGetMaxPcieLinkGeneration"),
            ("width", "nvmlDeviceGetCurrPcieLinkWidth"),
            ("max_width", "nvmlDeviceGetMaxPcieLinkWidth"))}
        return {
            "remapped_rows": None if remap is None else {
                "correctable": remap[0], "uncorrectable": remap[1],
                "pending": bool(remap[2]), "failed": bool(remap[3])},
            "retired_pages_pending": bool(self._best_effort(
                nvml.nvmlDeviceGetRetiredPagesPendingStatus, handle)),
            "nvlink": self._nvlink(device),
            "pcie": pcie,
            "clock_event_reasons": self._best_effort(
                nvml.nvmlDeviceGetCurrentClocksEventReasons, handle) or 0,
            "mig": None if mig is None else {"current": mig[0], "pending": mig[1]},
            "fabric": self._fabric_state(handle),
            "brand": self._best_effort(nvml.nvmlDeviceGetBrand, handle),
            "recovery_action": self._recovery_action(handle),
            "retired_pages": self._retired_pages(handle),
        }

    def _recovery_action(self, handle) -> int | None:
        """NVML's GPU recovery action (none, reset, reboot, drain …); None on a driver
        that does not report it."""
        field = getattr(self.nvml, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", None)
        values = field is not None and self._best_effort(
            self.nvml.nvmlDeviceGetFieldValues, handle, [field])
        if not values or values[0].nvmlReturn != 0:
            return None
        return int(values[0].value.uiVal)

    def _retired_pages(self, handle) -> dict | None:
        """Pages retired for repeated single-bit and for double-bit ECC errors (cards
        before row remapping); None where the card does not retire pages."""
        counts = {}
        for name, cause in (("single_bit", 0), ("double_bit", 1)):
            pages = self._best_effort(self.nvml.nvmlDeviceGetRetiredPages, handle, cause)
            if pages is None:
                return None
            counts[name] = len(pages)
        return counts

    def _nvlink(self, device: _Device) -> dict:
        active, crc = 0, 0
        for link in range(MAX_NVLINKS):
            state = self._best_effort(self.nvml.nvmlDeviceGetNvLinkState, device.handle, link)
            if state is None:
                break
            active += int(bool(state))
            crc += self._best_effort(self.nvml.nvmlDeviceGetNvLinkErrorCounter, device.handle,
                                     link, NVLINK_CRC_FLIT) or 0
        # CRC counters only grow; what matters is what is new since the last reading.
        new = max(0, crc - self.crc_seen.get(device.index, crc))
        self.crc_seen[device.index] = crc
        return {"active": active, "crc_errors": crc, "crc_errors_new": new}

    def _fabric_state(self, handle) -> str | None:
        info_type = getattr(self.nvml, "c_nvmlGpuFabricInfo_t", None)
        if info_type is None:
            return None
        import ctypes

        info = info_type()      # pynvml hands the struct to C as given: pass a pointer
        if self._best_effort(self.nvml.nvmlDeviceGetGpuFabricInfo, handle, ctypes.byref(info)) is None:
            return None         # not an NVSwitch system
        return FABRIC_STATES.get(int(info.state))

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
                self.xid_new[index] = (self.xid_new[index] + [int(event.eventData)])[-100:]

    def telemetry(self) -> list[dict]:
        """One reading per card for nodeagent/telemetry.py: utilisation (%), VRAM used (MiB),
        temperature (C), power (W), SM clock (MHz), the volatile ECC counters (cumulative)
        and the Xid events since the last call. A value the card or driver does not give is
        None; a card NVML cannot read at all is left out of this minute."""
        with self._lock:
            self._drain_xid_events()
            out = []
            for device in self.devices:
                xids, self.xid_new[device.index] = self.xid_new[device.index], []
                try:
                    out.append(self._reading(device, xids))
                except self.nvml.NVMLError as exc:
                    log.debug("telemetry of GPU %s unavailable: %s", device.index, exc)
            return out

    def _reading(self, device: _Device, xids: list[int]) -> dict:
        nvml, handle = self.nvml, device.handle
        util = self._best_effort(nvml.nvmlDeviceGetUtilizationRates, handle)
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        power_mw = self._best_effort(nvml.nvmlDeviceGetPowerUsage, handle)
        ecc = {name: self._best_effort(nvml.nvmlDeviceGetTotalEccErrors, handle, kind, nvml.NVML_VOLATILE_ECC)
               for name, kind in (("ecc_corrected", nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
                                  ("ecc_uncorrected", nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED))}
        return {"index": device.index, "util": None if util is None else int(util.gpu),
                "mem_mb": int(memory.used) // (1024 * 1024),
                "temp_c": self._best_effort(nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU),
                "power_w": None if power_mw is None else round(power_mw / 1000),
                "sm_mhz": self._best_effort(nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_SM),
                **ecc, "xids": xids}

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


def open_gpu_probe(*, max_temperature_c: int = 90, min_cuda: str = ""):
    """NVML when the library and driver answer, else the explicit no-GPU probe."""
    try:
        import pynvml
    except ImportError:
        return NoGpuProbe("nvidia-ml-py is not installed")
    try:
        pynvml.nvmlInit()
        return NvmlProbe(pynvml, max_temperature_c=max_temperature_c, min_cuda=min_cuda)
    except pynvml.NVMLError as exc:
        log.warning("no GPU library: %s", exc)
        return NoGpuProbe(str(exc))


def gpu_report(info: GpuInfo) -> dict:
    return {"index": info.index, "uuid": info.uuid, "name": info.name,
            "memory_mb": info.memory_mb, "driver": info.driver, "cuda": info.cuda,
            "temperature_c": info.temperature_c, "ecc_uncorrected": info.ecc_uncorrected,
            "xid_errors": list(info.xid_errors), "healthy": info.healthy,
            "problem": info.problem,
            "conditions": [c.as_json() for c in info.conditions],
            "topology": topology_report(info.readings)}


def topology_report(readings: dict) -> dict:
    """What a buyer cares about: PCIe link, NVLink peers and links, MIG mode."""
    pcie = readings.get("pcie") or {}
    return {"pcie_gen": pcie.get("gen"), "pcie_max_gen": pcie.get("max_gen"),
            "pcie_width": pcie.get("width"), "pcie_max_width": pcie.get("max_width"),
            "nvlink_peers": list(readings.get("nvlink_peers") or []),
            "nvlink_active": (readings.get("nvlink") or {}).get("active", 0),
            "mig": bool((readings.get("mig") or {}).get("current"))}
