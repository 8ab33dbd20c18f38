#!/usr/bin/env python3
"""GPU acceptance: the node agent's own GPU code against one real card, in under 8 minutes,
with Python, PyTorch and nvidia-ml-py only (no Docker, no network, no storefront):

    python3 scripts/gpu-acceptance.py [--gpu 0] [--seconds 300] [--json]

It prints what each part read, so a person can compare it with `nvidia-smi -q`:
1. the agent's NVML readings (nodeagent/gpu.py): name, brand, driver, CUDA, PCIe link,
   ECC, row remapping, retired pages, recovery action, clocks, MIG, NVLink;
2. the health-condition table: each condition the agent names (nodeagent/health.py) and the
   storefront's rule for it (fleet/conditions.py: incident, drain, warn);
3. the burn-in plan for the card's class and the four checks of every level
   (nodeagent/gpu_checks.py), with host-to-device bandwidth measured by the agent's routine
   (nodeagent/gpu_bandwidth.py, CUDA events);
4. the fallback burn-in (nodeagent/burn_in_fallback.py: timed matmul, memory patterns) and,
   where `dcgmi` is installed, DCGM level 1.

Exit 0 when every part ran and passed, 1 when a check or test failed, 2 when a part could not
run (no NVML, no CUDA, no PyTorch). In CI it runs against the stub libraries
(tests/nodeagent/test_gpu_acceptance.py). What only a real GPU server proves: see
docs/adr/0013-burn-in-by-card-class.md and nodeagent/README.md."""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# the agent's routines run as `python -m nodeagent…` in processes of their own
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))

from fleet.conditions import rule_for  # noqa: E402 - pure: no Django
from nodeagent.burnin import BurnInConfig, parse_dcgmi  # noqa: E402
from nodeagent.gpu import gpu_report, open_gpu_probe  # noqa: E402
from nodeagent.gpu_bandwidth import measure  # noqa: E402
from nodeagent.gpu_checks import SHORT, card_class, checks, plan  # noqa: E402

FALLBACK = ROOT / "nodeagent" / "burn_in_fallback.py"


def _say(args, text: str = "") -> None:
    if not args.json:
        print(text, flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpu", type=int, default=0, help="NVML index of the card (default 0)")
    parser.add_argument("--seconds", type=float, default=300, help="the fallback's matmul time")
    parser.add_argument("--python", default=sys.executable, help="the Python with PyTorch for the fallback")
    parser.add_argument("--fallback-args", default="", help="extra arguments for the fallback (tests)")
    parser.add_argument("--json", action="store_true", help="one JSON object instead of text")
    args = parser.parse_args(argv)
    started = time.monotonic()
    out: dict = {"parts": {}}
    failed = unable = False

    probe = open_gpu_probe()
    cards = probe.inventory()
    card = next((c for c in cards if c.index == args.gpu), None)
    if card is None:
        print(f"gpu-acceptance: no GPU {args.gpu} through NVML ({probe.library}: "
              f"{getattr(probe, 'reason', '')})", file=sys.stderr)
        return 2
    report = gpu_report(card)
    out["parts"]["nvml"] = {"report": report, "readings": {k: v for k, v in card.readings.items()
                                                           if k != "xid_errors"}}
    _say(args, f"1. NVML readings of GPU {card.index}: {card.name} ({card.uuid})")
    _say(args, f"   driver {card.driver}, CUDA {card.cuda}, {card.memory_mb} MiB, {card.temperature_c} C")
    for key in ("brand", "pcie", "ecc_uncorrected", "remapped_rows", "retired_pages", "retired_pages_pending",
                "recovery_action", "clock_event_reasons", "mig", "nvlink", "fabric"):
        _say(args, f"   {key}: {card.readings.get(key)}")

    conditions = [{**c.as_json(), "rule": rule_for(c.code)} for c in card.conditions]
    out["parts"]["conditions"] = conditions
    _say(args, f"2. Health conditions: {len(conditions) or 'none'}")
    for c in conditions:
        _say(args, f"   {c['code']} -> {c['rule']}: {c['detail']}")

    kind = card_class(card.readings.get("brand"), card.name)
    run = plan(kind, SHORT)
    measured = measure(card.uuid)
    found = checks(card.readings, measured, BurnInConfig().limits())
    out["parts"]["burn_in_checks"] = {"card_class": kind, "short_plan": run.__dict__, "bandwidth": measured,
                                      "checks": found}
    failed |= any(c["status"] == "fail" for c in found)
    _say(args, f"3. Burn-in: class {kind}; short = DCGM level {run.dcgm_level}"
               f"{' + fallback' if run.fallback else ''}; checks of every level:")
    for c in found:
        _say(args, f"   {c['name']}: {c['status']} {c['figures']} {c['detail']}")

    argv = [args.python, str(FALLBACK), "--uuid", card.uuid, "--seconds", str(args.seconds),
            *args.fallback_args.split()]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=args.seconds + 240)
    try:
        fallback = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        fallback = {"error": (done.stderr or "").strip()[-300:] or f"exit {done.returncode}"}
    out["parts"]["fallback"] = {"exit": done.returncode, **fallback}
    unable |= done.returncode == 2 or "tests" not in fallback
    failed |= done.returncode == 1
    _say(args, f"4. Fallback burn-in (exit {done.returncode}): {fallback.get('device', '')}")
    for t in fallback.get("tests", []):
        _say(args, f"   {t['name']}: {t['status']} — {t['info']}")
    if "error" in fallback:
        _say(args, f"   could not run: {fallback['error']}")
    dcgmi = shutil.which(BurnInConfig().dcgmi)
    if dcgmi:
        diag = subprocess.run([dcgmi, "diag", "-r", "1", "-j", "-i", str(card.index)], capture_output=True,
                              text=True, timeout=300)
        try:
            version, tests = parse_dcgmi(diag.stdout)
        except ValueError:
            version, tests = "", [{"name": "dcgmi", "status": "fail", "info": diag.stderr[-200:]}]
        out["parts"]["dcgm_level_1"] = {"version": version, "tests": tests}
        failed |= any(t["status"] == "fail" for t in tests)
        _say(args, f"   DCGM {version} level 1: " + ", ".join(f"{t['name']} {t['status']}" for t in tests))
    else:
        _say(args, "   DCGM: not installed (dcgmi not on PATH)")
    out["seconds"] = round(time.monotonic() - started, 1)
    out["result"] = "unable" if unable else "fail" if failed else "pass"
    if args.json:
        print(json.dumps(out, default=str))
    else:
        print(f"Result: {out['result']} in {out['seconds']} s")
    return 2 if unable else 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
