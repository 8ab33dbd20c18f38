"""bench/sizing_measure.py keeps working without a GPU: its CPU grid (tiny configs of the
Qwen2, Llama and Mistral families, built by transformers, LoRA by peft, real AdamW steps)
writes a table of the shape the GPU run writes, and ``--check`` reads it against the engine.

The measuring half runs in .venv-measure (scripts/install-measure-tools.sh); with CI=true a
missing venv fails the test. The check half is plain arithmetic over a table, tested on
tables made to order."""
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deadlines import load_factor
from tests.tools import require

ROOT = Path(__file__).resolve().parents[2]
MEASURE_PY = ROOT / ".venv-measure" / "bin" / "python"
sys.path.insert(0, str(ROOT / "bench"))
import sizing_measure  # noqa: E402

#: a hard bound on a broken run (the CPU grid takes about 20 s on an idle machine)
RUN_BUDGET_S = 180


@pytest.mark.infra  # one run in CI (the PostgreSQL pass): it needs no database, only time
def test_cpu_grid_writes_a_table_the_check_reads(tmp_path):
    require(any(MEASURE_PY.parent.parent.glob(".installed-*")),
            ".venv-measure is not built (scripts/install-measure-tools.sh)")
    out = tmp_path / "table.json"
    run = subprocess.run([str(MEASURE_PY), str(ROOT / "bench" / "sizing_measure.py"), "--grid", "tiny",
                          "--device", "cpu", "--steps", "2", "--out", str(out)],
                         capture_output=True, text=True, timeout=RUN_BUDGET_S * load_factor(), cwd=ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    table = json.loads(out.read_text())
    sizing_measure.validate(table)
    assert table["device"] == "cpu" and table["versions"]["torch"].startswith("2.13.0")
    assert len(table["rows"]) == len(sizing_measure.GRID_TINY)
    for row, (model, method, ckpt, seq, batch) in zip(table["rows"], sizing_measure.GRID_TINY, strict=True):
        assert (row["model"], row["method"], row["checkpointing"], row["seq"], row["batch"]) == (
            model, method, ckpt, seq, batch)
        assert not row["oom"] and row["peak_gb"] > 0 and row["tokens_per_s"] > 0
        # LoRA trains a sliver of the model; a full fine-tune all of it
        assert (row["trainable_params"] < row["params"] / 4) if method == "lora" else (
            row["trainable_params"] == row["params"])
    # the peak grows with what is kept: the full fine-tune of a model holds more than its LoRA
    # run at fewer tokens (weights + grads + two fp32 moments against frozen bf16 weights)
    by = {(r["model"], r["method"]): r for r in table["rows"]}
    assert by[("tiny-qwen2", "full")]["peak_gb"] > by[("tiny-qwen2", "lora")]["peak_gb"]
    buf = io.StringIO()
    _, results = sizing_measure.check(table, out=buf)
    text = buf.getvalue()
    assert text.count("ratio") == len(table["rows"]) and ("PASS" in text or "FAIL" in text)
    # the engine's safety holds on real steps: on the CPU (no CUDA context on either side) no
    # row is under-estimated
    assert all(r["ratio"] >= sizing_measure.LOW for r in results), text


def _table(ratios, device="cuda", oom_est=None):
    """A measured table whose rows' peaks are the engine's figure divided by ``ratios``."""
    rows = []
    for i, ratio in enumerate(ratios):
        job = sizing_measure.job_params(sizing_measure.CONFIGS["qwen2.5-0.5b"], "lora", True, 512 * (i + 1), 1)
        est = sizing_measure.engine_gb(job, device == "cuda")
        rows.append({"model": "qwen2.5-0.5b", "method": "lora", "checkpointing": True, "seq": 512 * (i + 1),
                     "batch": 1, "lora_rank": 16, "steps": 4, "params": 1, "trainable_params": 1,
                     "peak_allocated_gb": est / ratio, "peak_reserved_gb": est / ratio, "context_gb": 0.0,
                     "peak_gb": est / ratio, "tokens_per_s": 1000.0, "oom": False, "job": job})
    if oom_est is not None:
        rows.append({**rows[0], "oom": True, "peak_gb": None, "tokens_per_s": None})
    return {"date": "2026-12-05T00:00:00Z", "device": device, "card": "test card", "card_memory_gb": oom_est,
            "versions": {"torch": "x", "transformers": "x", "peft": "x", "driver": None, "python": "x"},
            "peak_definition": "test", "rows": rows}


@pytest.mark.parametrize(("ratios", "passes"), [
    ((1.0, 1.1, 1.29), True),
    ((0.91, 1.0), True),
    ((0.89, 1.0), False),  # one row under 0.9: never allowed
    ((1.0, 1.31), False),  # one row over 1.3: the engine sends customers to too big a card
])
def test_check_passes_only_when_every_row_is_within_the_band(ratios, passes):
    buf = io.StringIO()
    passed, results = sizing_measure.check(_table(ratios), out=buf)
    assert passed is passes, buf.getvalue()
    assert [round(r["ratio"], 2) for r in results] == [round(x, 2) for x in ratios]
    assert ("PASS" if passes else "FAIL") in buf.getvalue().splitlines()[-1]


def test_an_out_of_memory_row_agrees_only_when_the_engine_says_it_does_not_fit():
    fits = sizing_measure.check(_table((1.0,), oom_est=100.0), out=io.StringIO())[0]
    too_big = sizing_measure.check(_table((1.0,), oom_est=0.5), out=io.StringIO())[0]
    assert not fits and too_big


def test_a_table_without_its_versions_or_peaks_is_refused():
    bad = {"date": "d", "device": "cpu", "card": "c", "peak_definition": "p", "rows": [],
           "versions": {"torch": "x"}}
    with pytest.raises(ValueError, match="versions lack"):
        sizing_measure.validate(bad)


def test_the_throughput_report_gives_the_utilisation_a_row_implies():
    """A row whose tokens/s is what sizing.throughput predicts at utilisation u reads u."""
    from sizing.inputs import parse_request
    from sizing.throughput import flops_per_token

    table = _table((1.0, 1.1))
    for row, u in zip(table["rows"], (0.3, 0.5), strict=True):
        row["tokens_per_s"] = u * 989e12 / flops_per_token(parse_request(row["job"]).job)
    buf = io.StringIO()
    values = sizing_measure.throughput_report(table, 989, out=buf)
    assert [round(v, 6) for v in values] == [0.3, 0.5]
    assert "median 0.400" in buf.getvalue()
