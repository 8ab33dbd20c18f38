"""What a card's readings mean: each finding is a named condition (`code`, `detail`) that the
storefront maps to a rule — warn, drain the slot, or open an incident (fleet/conditions.py
holds that table; the agent only names what it sees, so the operator's rules change in one
place without redeploying agents).

Readings come from NVML (nodeagent/gpu.py): volatile uncorrected ECC, row remapping,
retired pages, NVLink link state and CRC errors, the PCIe link against its maximum, clock
event reasons, MIG mode, the NVSwitch fabric state and the driver's CUDA version."""
from dataclasses import dataclass

# NVIDIA's Xid catalogue. Critical: the card needs an operator (double-bit ECC, fallen off
# the bus, row-remap failure, uncontained memory errors, GSP/NVLink faults).
CRITICAL_XIDS = frozenset({48, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140})
# Caused by the customer's program (illegal address, MMU fault from user code, a killed
# or reset context): they say nothing about the card and never open an incident.
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 69})

# Clock event reasons (nvmlClocksEventReason*) that mean the card cannot hold its clocks.
THERMAL_SLOWDOWN = 0x20 | 0x40          # software and hardware thermal slowdown
POWER_SLOWDOWN = 0x08 | 0x80            # hardware slowdown, power brake
GPU_IDLE = 0x01

FABRIC_STATES = {1: "not_started", 2: "in_progress", 3: "completed"}


@dataclass(frozen=True)
class Condition:
    code: str
    detail: str

    def as_json(self) -> dict:
        return {"code": self.code, "detail": self.detail}


def _version_tuple(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split("."))
    except ValueError:
        return ()


def xid_conditions(xids) -> list[Condition]:
    critical = sorted(set(xids) & CRITICAL_XIDS)
    application = sorted(set(xids) & APPLICATION_XIDS)
    other = sorted(set(xids) - CRITICAL_XIDS - APPLICATION_XIDS)
    found = []
    if critical:
        found.append(Condition("xid_critical", "critical Xid " + ", ".join(map(str, critical))))
    if application:
        found.append(Condition("xid_application",
                               "application Xid " + ", ".join(map(str, application))))
    if other:
        found.append(Condition("xid_other", "Xid " + ", ".join(map(str, other))))
    return found


def _memory_conditions(r: dict) -> list[Condition]:
    found = []
    if r.get("ecc_uncorrected"):
        found.append(Condition("ecc_uncorrected", f"{r['ecc_uncorrected']} uncorrected ECC errors"))
    remap = r.get("remapped_rows") or {}
    if remap.get("failed"):
        found.append(Condition("row_remap_failed", "row remapping failed: the card needs service"))
    elif remap.get("pending"):
        found.append(Condition("row_remap_pending", "row remapping pending: reset the GPU "
                                                    "before the next lease"))
    if r.get("retired_pages_pending"):
        found.append(Condition("retired_pages_pending", "page retirement pending: reset the GPU"))
    return found


def _link_conditions(r: dict, *, node_max_links: int) -> list[Condition]:
    found = []
    nvlink = r.get("nvlink") or {}
    active = nvlink.get("active", 0)
    if node_max_links and active < node_max_links:
        found.append(Condition("nvlink_link_down",
                               f"{active} of {node_max_links} NVLink links active"))
    if nvlink.get("crc_errors_new"):
        found.append(Condition("nvlink_errors",
                               f"{nvlink['crc_errors_new']} new NVLink CRC errors"))
    pcie = r.get("pcie") or {}
    if pcie.get("width") and pcie.get("max_width") and pcie["width"] < pcie["max_width"]:
        found.append(Condition("pcie_width_degraded",
                               f"PCIe link x{pcie['width']} of x{pcie['max_width']}"))
    idle = (r.get("clock_event_reasons") or 0) & GPU_IDLE
    if pcie.get("gen") and pcie.get("max_gen") and pcie["gen"] < pcie["max_gen"] and not idle:
        found.append(Condition("pcie_gen_degraded",
                               f"PCIe gen {pcie['gen']} of {pcie['max_gen']} under load"))
    if r.get("fabric") and r["fabric"] != "completed":
        found.append(Condition("fabric_not_ready", f"NVSwitch fabric {r['fabric']} "
                                                   "(fabric manager not done)"))
    return found


def _run_conditions(r: dict, *, max_temperature_c: int, min_cuda: str) -> list[Condition]:
    found = []
    temperature = r.get("temperature_c")
    if temperature is not None and temperature >= max_temperature_c:
        found.append(Condition("temperature_high",
                               f"temperature {temperature} C >= {max_temperature_c} C"))
    reasons = r.get("clock_event_reasons") or 0
    if reasons & THERMAL_SLOWDOWN:
        found.append(Condition("clocks_throttled_thermal", "clocks slowed for temperature"))
    if reasons & POWER_SLOWDOWN:
        found.append(Condition("clocks_throttled_power", "clocks slowed by a power event"))
    if (r.get("mig") or {}).get("current"):
        found.append(Condition("mig_enabled", "MIG mode is on: not a whole GPU"))
    cuda = _version_tuple(r.get("cuda", ""))
    if min_cuda and cuda and cuda < _version_tuple(min_cuda):
        found.append(Condition("driver_too_old",
                               f"driver supports CUDA {r['cuda']}, images need {min_cuda}"))
    return found


def conditions_for(readings: dict, *, max_temperature_c: int, node_max_links: int = 0,
                   min_cuda: str = "") -> list[Condition]:
    """Every named condition in one GPU's readings, most serious families first."""
    return (_memory_conditions(readings) + xid_conditions(readings.get("xid_errors", ()))
            + _link_conditions(readings, node_max_links=node_max_links)
            + _run_conditions(readings, max_temperature_c=max_temperature_c, min_cuda=min_cuda))


# The agent's own verdict for storefronts that predate conditions (`healthy`, `problem`):
# the conditions that always took a card out of service.
UNHEALTHY = frozenset({"ecc_uncorrected", "temperature_high", "xid_critical",
                       "row_remap_failed", "gpu_lost"})


def legacy_verdict(conditions: list[Condition]) -> tuple[bool, str]:
    bad = [c.detail for c in conditions if c.code in UNHEALTHY]
    return not bad, "; ".join(bad)
