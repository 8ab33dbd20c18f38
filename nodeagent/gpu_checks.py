"""What a burn-in runs on a card of each class, and the checks every burn-in adds to the
diagnostic whatever its level (docs/adr/0013-burn-in-by-card-class.md).

Card class (from NVML's brand, else the name): NVIDIA documents DCGM's deep levels for its
datacenter cards only; GeForce and workstation (Quadro / RTX) cards get DCGM level 1 where
DCGM runs at all, so they always run the fallback too (a timed matmul and memory test).

Depth (asked by the storefront): `deep` before a card's first sale, after an incident and
on an operator's request (DCGM level 3 on a datacenter card); `short` before each next
lease and after a node reboot (level 1).

Every level also fails on:
- a pending recovery action (NVML's GPU recovery action, a pending row remap or page
  retirement): DCGM can pass a card that waits for a reset;
- a PCIe link trained below its maximum width, or below its maximum generation while the
  card is not idle (an idle card lowers its link speed on purpose; the bandwidth check
  then judges the speed it reaches under a copy);
- host-to-device bandwidth below `min_h2d_fraction` of the link's peak (its maximum
  generation and width);
- remapped rows over `max_remapped_rows`, retired pages over `max_retired_pages`, or a
  failed row remap.

All functions here are pure: readings in, verdicts with their figures out."""
from dataclasses import dataclass

DATACENTER, WORKSTATION, GEFORCE, UNKNOWN = "datacenter", "workstation", "geforce", "unknown"
DEEP, SHORT = "deep", "short"
DEPTHS = (DEEP, SHORT)

# nvmlBrandType_t
_BRANDS = {2: DATACENTER, 14: DATACENTER,                      # Tesla, NVIDIA (H100, B200 …)
           1: WORKSTATION, 3: WORKSTATION, 12: WORKSTATION, 13: WORKSTATION,   # Quadro, NVS, RTX
           5: GEFORCE, 6: GEFORCE, 15: GEFORCE, 16: GEFORCE}   # GeForce, Titan

# GB/s per lane and direction after line coding (PCI-SIG: 2.5/5 GT/s 8b/10b, then 128b/130b;
# gen 6 FLIT mode 242/256).
LANE_GBPS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}

# nvmlGpuRecoveryAction_t
RECOVERY_ACTIONS = {0: "none", 1: "gpu_reset", 2: "node_reboot", 3: "drain_p2p",
                    4: "drain_and_reset", 5: "recover_imex_domain", 6: "bus_reset",
                    7: "system_reboot"}
GPU_IDLE = 0x01                 # nvmlClocksEventReasonGpuIdle


@dataclass(frozen=True)
class Limits:
    """The named bounds (the agent's `[burn_in]` table)."""
    min_h2d_fraction: float = 0.6
    max_remapped_rows: int = 8
    max_retired_pages: int = 10


@dataclass(frozen=True)
class Plan:
    card_class: str
    dcgm_level: int             # 0: no DCGM run
    fallback: bool              # the fallback command must run (and pass)


def card_class(brand: int | None, name: str = "") -> str:
    if brand in _BRANDS:
        return _BRANDS[brand]
    text = name.lower()
    if "geforce" in text or "titan" in text:
        return GEFORCE
    if "quadro" in text or "rtx" in text:
        return WORKSTATION
    if any(part in text for part in ("tesla", "a100", "h100", "h200", "b200", "l40", "a10", "l4")):
        return DATACENTER
    return UNKNOWN


def plan(card: str, depth: str) -> Plan:
    """Datacenter: level 3 deep, level 1 short. GeForce and workstation: level 1 and the
    fallback at either depth. A card of unknown class gets both the level of its depth and
    the fallback: it is never tested less than the classes it might be."""
    if depth not in DEPTHS:
        raise ValueError(f"depth must be one of {DEPTHS}, not {depth!r}")
    if card == DATACENTER:
        return Plan(card, 3 if depth == DEEP else 1, False)
    if card in (GEFORCE, WORKSTATION):
        return Plan(card, 1, True)
    return Plan(card, 3 if depth == DEEP else 1, True)


def depth_for_level(level) -> str:
    """An older storefront asks for a DCGM level only: 3 or more is deep."""
    return DEEP if isinstance(level, int) and level >= 3 else SHORT


def link_peak_gbps(gen, width) -> float | None:
    if gen not in LANE_GBPS or not isinstance(width, int) or width <= 0:
        return None
    return round(LANE_GBPS[gen] * width, 3)


def _check(name: str, ok: bool, figures: dict, detail: str = "") -> dict:
    return {"name": name, "status": "pass" if ok else "fail", "figures": figures,
            "detail": "" if ok else detail}


def recovery_check(r: dict) -> dict:
    action = r.get("recovery_action")
    remap = r.get("remapped_rows") or {}
    figures = {"recovery_action": RECOVERY_ACTIONS.get(action, str(action)) if action is not None
               else None,
               "row_remap_pending": bool(remap.get("pending")),
               "retired_pages_pending": bool(r.get("retired_pages_pending"))}
    pending = [k for k, v in figures.items() if k != "recovery_action" and v]
    if action not in (None, 0):
        pending.insert(0, f"recovery action {figures['recovery_action']}")
    return _check("recovery_action", not pending, figures, "pending: " + ", ".join(pending))


def pcie_check(r: dict) -> dict:
    pcie = r.get("pcie") or {}
    idle = bool((r.get("clock_event_reasons") or 0) & GPU_IDLE)
    figures = {"gen": pcie.get("gen"), "max_gen": pcie.get("max_gen"), "width": pcie.get("width"),
               "max_width": pcie.get("max_width"), "idle": idle}
    if None in (figures["gen"], figures["max_gen"], figures["width"], figures["max_width"]):
        return _check("pcie_link", False, figures, "NVML did not report the PCIe link")
    problems = []
    if figures["width"] < figures["max_width"]:
        problems.append(f"width x{figures['width']} of x{figures['max_width']}")
    if figures["gen"] < figures["max_gen"] and not idle:
        problems.append(f"gen {figures['gen']} of {figures['max_gen']} under load")
    return _check("pcie_link", not problems, figures, "; ".join(problems))


def bandwidth_check(r: dict, measured: dict | None, limits: Limits) -> dict:
    pcie = r.get("pcie") or {}
    peak = link_peak_gbps(pcie.get("max_gen"), pcie.get("max_width"))
    gbps = (measured or {}).get("h2d_gbps")
    figures = {"h2d_gbps": gbps, "peak_gbps": peak, "min_fraction": limits.min_h2d_fraction,
               "fraction": round(gbps / peak, 3) if isinstance(gbps, int | float) and peak else None,
               "bytes": (measured or {}).get("bytes")}
    if not isinstance(gbps, int | float):
        why = (measured or {}).get("error") or "not measured"
        return _check("h2d_bandwidth", False, figures, f"host-to-device bandwidth {why}"[:300])
    if peak is None:
        return _check("h2d_bandwidth", False, figures, "the link's peak is unknown (no PCIe reading)")
    ok = figures["fraction"] >= limits.min_h2d_fraction
    return _check("h2d_bandwidth", ok, figures,
                  f"{gbps:.1f} GB/s is {figures['fraction']:.0%} of the link's {peak:.1f} GB/s "
                  f"(at least {limits.min_h2d_fraction:.0%} needed)")


def memory_rows_check(r: dict, limits: Limits) -> dict:
    remap = r.get("remapped_rows") or {}
    rows = int(remap.get("correctable") or 0) + int(remap.get("uncorrectable") or 0)
    retired = r.get("retired_pages") or {}
    pages = int(retired.get("single_bit") or 0) + int(retired.get("double_bit") or 0)
    figures = {"remapped_rows": rows, "max_remapped_rows": limits.max_remapped_rows,
               "row_remap_failed": bool(remap.get("failed")), "retired_pages": pages,
               "max_retired_pages": limits.max_retired_pages}
    problems = []
    if figures["row_remap_failed"]:
        problems.append("row remapping failed")
    if rows > limits.max_remapped_rows:
        problems.append(f"{rows} remapped rows > {limits.max_remapped_rows}")
    if pages > limits.max_retired_pages:
        problems.append(f"{pages} retired pages > {limits.max_retired_pages}")
    return _check("memory_rows", not problems, figures, "; ".join(problems))


def checks(readings: dict, measured: dict | None, limits: Limits) -> list[dict]:
    """The four checks of every burn-in level, each with its figures."""
    return [recovery_check(readings), pcie_check(readings),
            bandwidth_check(readings, measured, limits), memory_rows_check(readings, limits)]
