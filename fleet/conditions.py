"""What the storefront does about each named condition a node agent reports for a GPU
(nodeagent/health.py names them): the one table of rules.

- incident: the card is out of service (an incident on its slot, the customer on it is
  told and compensated by the SLA), until the condition clears or an operator closes it;
- drain: the card finishes its current lease but is not sold again while the condition
  lasts (the slot's health hold);
- warn: shown on the node page, nothing else.

An unknown code (a newer agent) is a warning: it is shown, never acted on blindly."""
INCIDENT, DRAIN, WARN = "incident", "drain", "warn"

RULES = {
    "gpu_lost": INCIDENT,
    "ecc_uncorrected": INCIDENT,
    "row_remap_failed": INCIDENT,
    "xid_critical": INCIDENT,
    "temperature_high": INCIDENT,
    "gpu_detached": INCIDENT,      # a running instance lost its GPU (after an agent upgrade)
    "row_remap_pending": DRAIN,
    "retired_pages_pending": DRAIN,
    "nvlink_link_down": DRAIN,
    "pcie_width_degraded": DRAIN,
    "fabric_not_ready": DRAIN,
    "mig_enabled": DRAIN,          # MIG slices are not sold: a MIG-enabled card is not whole
    "driver_too_old": DRAIN,
    "xid_application": WARN,       # the customer's program (Xid 13, 31, 43, 45, …), not the card
    "xid_other": WARN,
    "nvlink_errors": WARN,
    "pcie_gen_degraded": WARN,
    "clocks_throttled_thermal": WARN,
    "clocks_throttled_power": WARN,
}


def rule_for(code: str) -> str:
    return RULES.get(code, WARN)


def split_by_rule(conditions: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {INCIDENT: [], DRAIN: [], WARN: []}
    for condition in conditions:
        out[rule_for(condition["code"])].append(condition)
    return out
