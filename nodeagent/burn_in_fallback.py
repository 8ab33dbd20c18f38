#!/usr/bin/env python3
"""The documented fallback burn-in (nodeagent/README.md, "Burn-in before every sale"): what a
GeForce or workstation card runs beside DCGM level 1, and any card where DCGM is not
installed. Standalone (the standard library and PyTorch only), so it can be copied into an
instance image and run with `docker run --gpus device={uuid}`, or run on the host:

    [burn_in]
    fallback_command = ["python3", "/usr/lib/gpu-node-agent/burn_in_fallback.py", "--uuid", "{uuid}"]

Two tests, within `--seconds` together:
- matmul: the same FP32 product, repeated, must give the same bits every time (a card that
  computes wrong under heat or load gives different ones), and must match a float64 CPU
  reference on sampled rows within a bound that FP32 accumulation cannot exceed; it reports
  the TFLOPS it reached.
- memory pattern: most of the free memory, in chunks, written with three patterns (all ones
  and zeros alternating, their inverse, each word's own index) and compared on the card.

Prints {"tests": [{"name", "status", "info"}], "tool", "version", "device"} and exits 0 when
both pass, 1 when one fails, 2 when it cannot run (no CUDA device and no --allow-cpu)."""
import argparse
import json
import os
import sys
import time

VERSION = "1"


def _matmul(torch, device, *, n: int, seconds: float) -> dict:
    gen = torch.Generator(device="cpu").manual_seed(1234)
    a_cpu = torch.randn(n, n, generator=gen, dtype=torch.float32)
    b_cpu = torch.randn(n, n, generator=gen, dtype=torch.float32)
    a, b = a_cpu.to(device), b_cpu.to(device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False     # plain FP32: a bound we can state
    first = torch.matmul(a, b)
    rows = torch.arange(0, n, max(1, n // 16))
    reference = torch.matmul(a_cpu[rows].double(), b_cpu.double())
    # FP32 with n-term dot products: error <= n * eps * sum|a||b| (a standard bound)
    bound = n * torch.finfo(torch.float32).eps * torch.matmul(a_cpu[rows].abs().double(), b_cpu.abs().double())
    off = ((first[rows].cpu().double() - reference).abs() > bound).sum().item()
    repeats, mismatched, started = 0, 0, time.monotonic()
    while time.monotonic() - started < seconds or repeats == 0:
        again = torch.matmul(a, b)
        mismatched += int(not torch.equal(again, first))
        repeats += 1
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elapsed = max(time.monotonic() - started, 1e-9)
    tflops = 2 * n ** 3 * repeats / elapsed / 1e12
    ok = off == 0 and mismatched == 0
    return {"name": "matmul", "status": "pass" if ok else "fail",
            "info": f"n={n}, {repeats} repeats in {elapsed:.1f}s, {tflops:.2f} TFLOPS FP32; "
                    f"{mismatched} repeats differed from the first; {off} sampled values outside "
                    f"the FP32 error bound of a float64 reference"}


def _memory(torch, device, *, fraction: float, chunk_bytes: int, max_bytes: int | None) -> dict:
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
    else:
        free = total = max_bytes or 64 * 1024 ** 2
    budget = int(free * fraction) if max_bytes is None else min(max_bytes, int(free * fraction))
    chunks, taken = [], 0
    words = chunk_bytes // 8
    try:
        while taken + chunk_bytes <= budget:
            chunks.append(torch.empty(words, dtype=torch.int64, device=device))
            taken += chunk_bytes
    except RuntimeError:            # out of memory before the budget: test what we got
        pass
    bad = 0
    index = torch.arange(words, dtype=torch.int64, device=device)
    for pattern in (0x5555555555555555, -0x5555555555555556, None):   # 0x55…, 0xAA…, own index
        for i, chunk in enumerate(chunks):
            if pattern is None:
                chunk.copy_(index).add_(i * words)
            else:
                chunk.fill_(pattern)
        for i, chunk in enumerate(chunks):
            expected = index + i * words if pattern is None else pattern
            bad += int((chunk != expected).sum().item())
    del chunks
    ok = taken > 0 and bad == 0
    return {"name": "memory pattern", "status": "pass" if ok else "fail",
            "info": f"{taken / 1024 ** 3:.2f} GiB of {total / 1024 ** 3:.2f} GiB written with 3 patterns, "
                    f"{bad} words read back wrong"}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--uuid", help="the GPU (NVML's UUID); default: the first CUDA device")
    parser.add_argument("--seconds", type=float, default=120, help="time for the matmul repeats")
    parser.add_argument("--n", type=int, default=8192, help="matrix size")
    parser.add_argument("--memory-fraction", type=float, default=0.9, help="of the free memory")
    parser.add_argument("--max-memory-mb", type=int, help="at most this much memory (tests)")
    parser.add_argument("--allow-cpu", action="store_true", help="run on the CPU without a GPU (tests)")
    args = parser.parse_args(argv)
    if args.uuid:
        os.environ["CUDA_VISIBLE_DEVICES"] = args.uuid    # before torch initialises CUDA
    try:
        import torch
    except ImportError:
        print(json.dumps({"error": "PyTorch is not installed"}))
        return 2
    if torch.cuda.is_available():
        device = torch.device("cuda", 0)
        name = torch.cuda.get_device_name(device)
    elif args.allow_cpu:
        device, name = torch.device("cpu"), "cpu"
    else:
        print(json.dumps({"error": "no CUDA device"}))
        return 2
    tests = [_matmul(torch, device, n=args.n, seconds=args.seconds),
             _memory(torch, device, fraction=args.memory_fraction, chunk_bytes=64 * 1024 ** 2,
                     max_bytes=args.max_memory_mb * 1024 ** 2 if args.max_memory_mb else None)]
    print(json.dumps({"tests": tests, "tool": "gpu-storefront fallback burn-in", "version": VERSION,
                      "device": name, "torch": torch.__version__}))
    return 0 if all(t["status"] == "pass" for t in tests) else 1


if __name__ == "__main__":
    sys.exit(main())
