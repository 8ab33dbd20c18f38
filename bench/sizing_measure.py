"""Measure what fine-tuning really takes on one GPU, and check the sizing engine against it.

Two modes, two environments:

* **measure** (the default) runs in the measuring venv (``.venv-measure``, built by
  ``scripts/install-measure-tools.sh`` from ``bench/sizing_measure.requirements.txt``:
  PyTorch, transformers, peft; no bitsandbytes, no downloads). For every row of a grid it
  builds the model from its config with random weights, runs a few optimizer steps (AdamW,
  bf16 autocast, PyTorch's SDPA attention, Hugging Face's own causal-LM loss: the engine's
  ``hf`` stack) and records the peak memory and the tokens per second. On a GPU the peak is
  ``torch.cuda.max_memory_allocated``/``_reserved`` plus the CUDA context (what the card
  must hold: the engine's ``per_gpu_gb``); on the CPU (``--grid tiny``, what CI runs) it is
  the live bytes the profiler's allocation events add up to, on tiny configs of the same
  families, so the same code keeps working. The table (JSON) carries the date, the card,
  the driver and the library versions, and every row's job as calculator input.

      .venv-measure/bin/python bench/sizing_measure.py                  # the GPU grid
      .venv-measure/bin/python bench/sizing_measure.py --grid tiny --device cpu --out /tmp/t.json

* **check** (``--check TABLE``) runs in the storefront's venv (it imports the engine): the
  engine's estimate of every row against the measured peak; it prints each ratio and exits
  1 unless every row is within ``--low``–``--high`` (0.9–1.3×).

      .venv/bin/python bench/sizing_measure.py --check sizing/measured/<table>.json [--tflops 989]

  With ``--tflops`` (the card's dense BF16 figure, as the catalog has it) it also prints the
  utilisation each row's tokens/s implies under ``sizing.throughput``'s FLOPs count: the
  figure the calculator's 0.40 (0.25-0.75) is to be set against.

The GPU grid is sized to finish in under 8 minutes on one H100/H200 class card (about 20
rows of 4 steps; the 7–8B LoRA rows dominate). Design: docs/adr/0012-sizing-measured-and-time-to-finish.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / "sizing" / "measured"
GB = 1e9

# --- model configs (the Hub's config.json fields; nothing is downloaded) -------------------

CONFIGS: dict[str, dict] = {
    "qwen2.5-0.5b": {"model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864,
                     "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
                     "vocab_size": 151936, "tie_word_embeddings": True, "max_position_embeddings": 32768},
    "qwen2.5-1.5b": {"model_type": "qwen2", "hidden_size": 1536, "intermediate_size": 8960,
                     "num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2,
                     "vocab_size": 151936, "tie_word_embeddings": True, "max_position_embeddings": 32768},
    "qwen2.5-3b": {"model_type": "qwen2", "hidden_size": 2048, "intermediate_size": 11008,
                   "num_hidden_layers": 36, "num_attention_heads": 16, "num_key_value_heads": 2,
                   "vocab_size": 151936, "tie_word_embeddings": True, "max_position_embeddings": 32768},
    "qwen2.5-7b": {"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944,
                   "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
                   "vocab_size": 152064, "tie_word_embeddings": False, "max_position_embeddings": 32768},
    "llama-3.2-1b": {"model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192,
                     "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
                     "head_dim": 64, "vocab_size": 128256, "tie_word_embeddings": True,
                     "max_position_embeddings": 131072},
    "llama-3.1-8b": {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
                     "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                     "vocab_size": 128256, "tie_word_embeddings": False, "max_position_embeddings": 131072},
    "mistral-7b-v0.3": {"model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336,
                        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                        "vocab_size": 32768, "tie_word_embeddings": False, "max_position_embeddings": 32768},
}

#: tiny configs of the same three families, for the CPU run (seconds, not minutes)
TINY: dict[str, dict] = {
    "tiny-qwen2": {"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 176,
                   "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                   "vocab_size": 512, "tie_word_embeddings": True, "max_position_embeddings": 512},
    "tiny-llama": {"model_type": "llama", "hidden_size": 64, "intermediate_size": 160,
                   "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 1,
                   "vocab_size": 640, "tie_word_embeddings": False, "max_position_embeddings": 512},
    "tiny-mistral": {"model_type": "mistral", "hidden_size": 64, "intermediate_size": 192,
                     "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                     "vocab_size": 384, "tie_word_embeddings": False, "max_position_embeddings": 512},
}

# (model, method, checkpointing, seq, micro-batch)
GRID_GPU: tuple[tuple[str, str, bool, int, int], ...] = (
    ("qwen2.5-0.5b", "full", False, 512, 4),
    ("qwen2.5-0.5b", "full", True, 2048, 4),
    ("qwen2.5-0.5b", "full", False, 4096, 1),
    ("qwen2.5-0.5b", "lora", False, 2048, 2),
    ("qwen2.5-0.5b", "lora", True, 4096, 4),
    ("llama-3.2-1b", "full", True, 2048, 2),
    ("llama-3.2-1b", "lora", False, 1024, 4),
    ("qwen2.5-1.5b", "full", False, 1024, 2),
    ("qwen2.5-1.5b", "full", True, 4096, 2),
    ("qwen2.5-1.5b", "lora", True, 2048, 4),
    ("qwen2.5-3b", "full", True, 2048, 1),
    ("qwen2.5-3b", "lora", False, 1024, 2),
    ("qwen2.5-7b", "lora", True, 2048, 1),
    ("qwen2.5-7b", "lora", True, 4096, 2),
    ("qwen2.5-7b", "lora", False, 512, 2),
    ("llama-3.1-8b", "lora", True, 1024, 1),
    ("llama-3.1-8b", "lora", True, 4096, 1),
    ("llama-3.1-8b", "lora", False, 2048, 1),
    ("llama-3.1-8b", "lora", True, 2048, 4),
    ("mistral-7b-v0.3", "lora", True, 2048, 2),
    ("mistral-7b-v0.3", "lora", False, 1024, 1),
)
GRID_TINY: tuple[tuple[str, str, bool, int, int], ...] = (
    ("tiny-qwen2", "full", False, 64, 2),
    ("tiny-qwen2", "lora", True, 128, 1),
    ("tiny-llama", "full", True, 64, 1),
    ("tiny-llama", "lora", False, 32, 2),
    ("tiny-mistral", "lora", True, 64, 2),
)
LORA_RANK = 16
STEPS = 4  # the first is a warm-up: not timed
ROW_FIELDS = ("model", "method", "checkpointing", "seq", "batch", "lora_rank", "steps", "params",
              "trainable_params", "peak_allocated_gb", "peak_reserved_gb", "context_gb", "peak_gb",
              "tokens_per_s", "oom", "job")


def job_params(config: dict, method: str, checkpointing: bool, seq: int, batch: int) -> dict:
    """The row as calculator input (``sizing.inputs.parse_request``): the same config, the
    ``hf`` stack (Hugging Face loss, PEFT adapters in fp32), SDPA = no stored s² scores."""
    return {"config": config, "method": method, "checkpointing": checkpointing, "seq": seq, "batch": batch,
            "lora_rank": LORA_RANK, "lora_targets": "all", "framework": "hf", "flash_attention": True}


# --- measuring (needs torch, transformers, peft) -------------------------------------------

class _CpuPeak:
    """Peak live bytes of a CPU run, from the profiler's allocation events (positive on
    allocation, negative on free) added to what was alive when it started."""

    def __init__(self, torch, baseline: int):
        self.torch, self.baseline, self.peak = torch, baseline, baseline

    def __enter__(self):
        from torch.profiler import ProfilerActivity, profile
        self.prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        self.prof.__enter__()
        return self

    def __exit__(self, *exc):
        self.prof.__exit__(*exc)
        live = self.baseline
        events = [e for e in self.prof.profiler.kineto_results.events() if e.name() == "[memory]"]
        for e in sorted(events, key=lambda e: e.start_ns()):
            live += e.nbytes()
            self.peak = max(self.peak, live)
        return False


def _live_bytes(model, opt) -> int:
    seen, total = set(), 0
    tensors = list(model.parameters()) + list(model.buffers())
    tensors += [t for state in opt.state.values() for t in state.values() if hasattr(t, "untyped_storage")]
    for t in tensors:
        key = t.untyped_storage().data_ptr()
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
    return total


def _build(torch, config: dict, method: str, checkpointing: bool, device: str):
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(**config)
    cfg.use_cache = False
    # full: fp32 weights under bf16 autocast (Trainer bf16=True on an fp32 model: fp32 master,
    # fp32 grads, AdamW fp32); LoRA: the frozen base in bf16, the adapters fp32 (PEFT's default)
    dtype = torch.float32 if method == "full" else torch.bfloat16
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation="sdpa")
    if checkpointing:  # transformers 5 renamed it; the old name still works, with a warning
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if method == "lora":
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=LORA_RANK, lora_alpha=2 * LORA_RANK, lora_dropout=0.0,
                                                 target_modules="all-linear", task_type="CAUSAL_LM"))
    model.train()
    return model


def measure_row(torch, name: str, config: dict, method: str, checkpointing: bool, seq: int, batch: int,
                device: str, steps: int = STEPS, context: float = 0.0) -> dict:
    cuda = device == "cuda"
    row = {"model": name, "method": method, "checkpointing": checkpointing, "seq": seq, "batch": batch,
           "lora_rank": LORA_RANK, "steps": steps, "oom": False,
           "job": job_params(config, method, checkpointing, seq, batch)}
    model = opt = None
    try:
        model = _build(torch, config, method, checkpointing, device)
        params = [p for p in model.parameters() if p.requires_grad]
        row["params"] = sum(p.numel() for p in model.parameters())
        row["trainable_params"] = sum(p.numel() for p in params)
        opt = torch.optim.AdamW(params, lr=1e-5, fused=cuda)
        gen = torch.Generator(device=device).manual_seed(0)
        vocab = config["vocab_size"]

        def step():
            ids = torch.randint(vocab, (batch, seq), device=device, generator=gen)
            with torch.autocast(device_type=device, dtype=torch.bfloat16):
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        step()  # warm-up: creates the optimizer states
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        if cuda:
            for _ in range(steps - 1):
                step()
            torch.cuda.synchronize()
            row["peak_allocated_gb"] = torch.cuda.max_memory_allocated() / GB
            row["peak_reserved_gb"] = torch.cuda.max_memory_reserved() / GB
        else:
            with _CpuPeak(torch, _live_bytes(model, opt)) as meter:
                for _ in range(steps - 1):
                    step()
            row["peak_allocated_gb"] = row["peak_reserved_gb"] = meter.peak / GB
        elapsed = time.perf_counter() - start
        row["tokens_per_s"] = batch * seq * (steps - 1) / elapsed
        row["context_gb"] = context
        row["peak_gb"] = row["peak_reserved_gb"] + context
    except torch.OutOfMemoryError:
        row.update(oom=True, peak_allocated_gb=None, peak_reserved_gb=None, context_gb=context, peak_gb=None,
                   tokens_per_s=None)
        row.setdefault("params", None)
        row.setdefault("trainable_params", None)
    finally:
        model = opt = None  # noqa: F841 - drop the references before the next row
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
    return row


def _versions(torch) -> dict:
    import peft
    import transformers

    out = {"python": platform.python_version(), "torch": torch.__version__,
           "transformers": transformers.__version__, "peft": peft.__version__,
           "cuda": getattr(torch.version, "cuda", None)}
    try:
        out["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                       capture_output=True, text=True, timeout=20).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        out["driver"] = None
    return out


def measure(grid: str, device: str, steps: int, only: int | None = None) -> dict:
    import torch

    torch.manual_seed(0)
    cuda = device == "cuda"
    configs = CONFIGS if grid == "gpu" else TINY
    rows_in = GRID_GPU if grid == "gpu" else GRID_TINY
    if only is not None:
        rows_in = rows_in[:only]
    context = 0.0
    card, total = platform.processor() or platform.machine(), None
    if cuda:
        torch.cuda.init()
        torch.empty(1, device="cuda")
        free, total_b = torch.cuda.mem_get_info()
        context = (total_b - free - torch.cuda.memory_reserved()) / GB
        card, total = torch.cuda.get_device_name(), total_b / GB
    started = time.perf_counter()
    rows = []
    for name, method, ckpt, seq, batch in rows_in:
        row = measure_row(torch, name, configs[name], method, ckpt, seq, batch, device, steps, context)
        rows.append(row)
        print(_row_line(row), flush=True)
    return {"date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), "device": device, "card": card,
            "card_memory_gb": total, "grid": grid, "versions": _versions(torch),
            "peak_definition": ("max_memory_reserved + CUDA context (device memory in use before the first "
                                "tensor)" if cuda else "CPU: live tensor bytes from the profiler's allocation "
                                "events; no context"),
            "seconds": round(time.perf_counter() - started, 1), "rows": rows}


def _row_line(row: dict) -> str:
    what = f"{row['model']:16} {row['method']:4} ckpt={'on ' if row['checkpointing'] else 'off'} " \
           f"{row['seq']:5}×{row['batch']}"
    if row["oom"]:
        return f"{what}  out of memory"
    return (f"{what}  peak {row['peak_gb']:8.3f} GB (alloc {row['peak_allocated_gb']:.3f}, "
            f"reserved {row['peak_reserved_gb']:.3f})  {row['tokens_per_s']:10.0f} tok/s")


def default_out(table: dict) -> Path:
    card = "".join(ch if ch.isalnum() else "-" for ch in str(table["card"]).lower()).strip("-") or "cpu"
    return OUT_DIR / f"{table['date'][:10]}-{card}.json"


# --- checking (needs the engine: the storefront's venv) ------------------------------------

LOW, HIGH = 0.9, 1.3


def engine_gb(job: dict, with_context: bool = True) -> float:
    """The engine's per-GPU GB for a row's job; without the CUDA context term for a table
    measured where there is none (the CPU)."""
    if "DJANGO_SETTINGS_MODULE" not in os.environ:
        os.environ["DJANGO_SETTINGS_MODULE"] = "storefront.test_settings"
    import django

    django.setup()
    from sizing.estimation import estimate
    from sizing.inputs import parse_request

    e = estimate(parse_request(job).job)
    return e.per_gpu_gb if with_context else e.per_gpu_gb - e.breakdown_gb["cuda_context"]


def implied_utilisation(row: dict, tflops: float) -> float:
    """The share of the card's dense BF16 peak the row's measured tokens/s implies under
    ``sizing.throughput``'s FLOPs count (what the calculator's utilisation is held to)."""
    from sizing.inputs import parse_request
    from sizing.throughput import flops_per_token

    return row["tokens_per_s"] * flops_per_token(parse_request(row["job"]).job) / (tflops * 1e12)


def throughput_report(table: dict, tflops: float, out=sys.stdout) -> list[float]:
    """Each measured row's implied utilisation on a card of ``tflops`` dense BF16 TFLOPS, and
    their median: the figure to set against ``sizing.throughput.UTILISATION`` and its range."""
    engine_gb({"model": "llama-2-7b"})  # Django set up
    from sizing.throughput import UTILISATION, UTILISATION_RANGE

    values = []
    for row in table["rows"]:
        if row.get("oom"):
            continue
        u = implied_utilisation(row, tflops)
        values.append(u)
        print(f"{_label(row):44} {row['tokens_per_s']:10.0f} tok/s  implied utilisation {u:.3f}", file=out)
    if values:
        lo, hi = UTILISATION_RANGE
        print(f"implied utilisation: median {statistics.median(values):.3f}, min {min(values):.3f}, "
              f"max {max(values):.3f}; the calculator assumes {UTILISATION} ({lo}-{hi})", file=out)
    return values


def check(table: dict, low: float = LOW, high: float = HIGH, out=sys.stdout) -> tuple[bool, list[dict]]:
    """Every measured row's engine/measured ratio; ok when all are within [low, high]. A row
    that ran out of memory counts as within when the engine also says it does not fit the
    card (estimate above the card's memory). A CPU table has no CUDA context: the engine's
    context term is left out of its figure."""
    results = []
    with_context = table.get("device") == "cuda"
    for row in table["rows"]:
        est = engine_gb(row["job"], with_context)
        if row.get("oom"):
            card = table.get("card_memory_gb")
            ok = card is not None and est > card
            results.append({"row": row, "engine_gb": est, "ratio": None, "ok": ok})
            print(f"{_label(row):44} out of memory; engine {est:7.2f} GB {'ok' if ok else 'FITS?'}", file=out)
            continue
        ratio = est / row["peak_gb"]
        ok = low <= ratio <= high
        results.append({"row": row, "engine_gb": est, "ratio": ratio, "ok": ok})
        print(f"{_label(row):44} measured {row['peak_gb']:8.3f} GB  engine {est:8.3f} GB  ratio {ratio:5.2f}"
              f"{'' if ok else '  OUTSIDE'}", file=out)
    ratios = [r["ratio"] for r in results if r["ratio"] is not None]
    passed = bool(results) and all(r["ok"] for r in results)
    if ratios:
        print(f"{len(ratios)} rows: median {statistics.median(ratios):.2f}, min {min(ratios):.2f}, "
              f"max {max(ratios):.2f}; within {low}-{high}: {sum(r['ok'] for r in results)}/{len(results)}; "
              f"under {low}: {sum(x < low for x in ratios)}", file=out)
    print("PASS" if passed else "FAIL", file=out)
    return passed, results


def _label(row: dict) -> str:
    return (f"{row['model']} {row['method']} ckpt={'on' if row['checkpointing'] else 'off'} "
            f"{row['seq']}×{row['batch']}")


def validate(table: dict) -> None:
    """The table's shape (raises ValueError): what --check and the docs rely on."""
    for key in ("date", "device", "card", "versions", "rows", "peak_definition"):
        if key not in table:
            raise ValueError(f"table lacks {key!r}")
    for key in ("torch", "transformers", "peft", "driver", "python"):
        if key not in table["versions"]:
            raise ValueError(f"versions lack {key!r}")
    for row in table["rows"]:
        missing = [k for k in ROW_FIELDS if k not in row]
        if missing:
            raise ValueError(f"row {row.get('model')} lacks {missing}")
        if not row["oom"] and not (row["peak_gb"] > 0 and row["tokens_per_s"] > 0):
            raise ValueError(f"row {row['model']} has no peak or throughput")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", metavar="TABLE", help="compare the engine with a measured table (JSON)")
    p.add_argument("--low", type=float, default=LOW)
    p.add_argument("--high", type=float, default=HIGH)
    p.add_argument("--tflops", type=float, help="with --check: the card's dense BF16 TFLOPS, to print each "
                   "row's implied utilisation (sizing.throughput)")
    p.add_argument("--grid", choices=("gpu", "tiny"), default=None, help="default: gpu on CUDA, tiny on CPU")
    p.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda when available")
    p.add_argument("--steps", type=int, default=STEPS)
    p.add_argument("--only", type=int, default=None, help="the first N rows of the grid")
    p.add_argument("--out", help=f"where to write the table (default {OUT_DIR.relative_to(ROOT)}/<date>-<card>.json)")
    args = p.parse_args(argv)
    if args.check:
        table = json.loads(Path(args.check).read_text())
        validate(table)
        passed, _ = check(table, args.low, args.high)
        if args.tflops:
            throughput_report(table, args.tflops)
        return 0 if passed else 1
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    grid = args.grid or ("gpu" if device == "cuda" else "tiny")
    table = measure(grid, device, max(args.steps, 2), args.only)
    validate(table)
    out = Path(args.out) if args.out else default_out(table)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(table, indent=1) + "\n")
    print(f"wrote {out} ({len(table['rows'])} rows, {table['seconds']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
