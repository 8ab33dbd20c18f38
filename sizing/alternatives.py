"""The cheapest plans that change one choice of the customer's job (pure Python).

For each change (ROCm allowed, QLoRA instead of LoRA, an 8-bit optimizer, LoRA instead of
a full fine-tune, a full fine-tune's optimizer states offloaded to host memory) the recommender runs again with only that choice changed; a change is
shown when it runs the job for less than the recommended plan (or at all, when nothing fits
as asked), with its price and what it costs in return. ZeRO-3 across an NVLink pair (or
node) needs no change of input: the recommender itself shards the job over a multi-GPU
offer when it does not fit one card, and labels that row with the trade-off.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.utils.translation import gettext_noop

from .engine import Job
from .recommend import Candidate, Option, cheapest
from .texts import Texts, texts


@dataclass(frozen=True)
class Change:
    key: str  # vendor | qlora | optimizer-8bit | lora | offload
    label: str
    tradeoff: str
    option: Option
    query: dict  # the changed input, as calculator/API parameters


def _variants(job: Job, vendor: str) -> list[tuple[str, dict, Job, str]]:
    """(key, changed parameters, changed job, vendor) for every change that applies."""
    out = []
    if vendor == "cuda":
        out.append(("vendor", {"vendor": "any"}, job, "any"))
    if job.method == "lora":
        out.append(("qlora", {"method": "qlora"}, job.laid_out(job.gpus, job.zero, job.offload, "qlora"), vendor))
    if job.method == "full":
        out.append(("optimizer-8bit", {"method": "full-8bit"}, job.laid_out(job.gpus, job.zero, job.offload, "full-8bit"), vendor))
    if job.method in ("full", "full-8bit"):
        out.append(("lora", {"method": "lora"}, job.laid_out(job.gpus, job.zero, job.offload, "lora"), vendor))
        if job.offload == "none":
            # ZeRO-3 with the master weights and moments in host RAM: only the offers whose
            # instance holds them fit (recommend.host_ram_short)
            out.append(("offload", {"zero": "3", "offload": "optimizer"},
                        job.laid_out(job.gpus, 3, "optimizer", job.method), vendor))
    return out


#: each change's label and trade-off (msgids; translated when a change is shown)
TEXTS = {
    "vendor": (gettext_noop("ROCm allowed (AMD cards too)"),
               gettext_noop("PyTorch, PEFT and FlashAttention run on ROCm; bitsandbytes 4-bit and some "
                            "fused kernels need ROCm builds of their own.")),
    "qlora": (gettext_noop("QLoRA instead of LoRA"),
              # xgettext:no-python-format
              gettext_noop("4-bit base: 20–40% slower (dequantisation) and a small quality cost.")),
    "optimizer-8bit": (gettext_noop("8-bit optimizer"),
                       gettext_noop("Adam's moments in 8 bit: 16 → 10 bytes per parameter; training "
                                    "curves stay close to fp32 Adam.")),
    "lora": (gettext_noop("LoRA instead of a full fine-tune"),
             gettext_noop("Trains adapters only; the quality gap is usually far smaller than the cost "
                          "gap — prove LoRA's ceiling first.")),
    "offload": (gettext_noop("Optimizer states in host memory (ZeRO-3 offload)"),
                gettext_noop("The fp32 master weights and Adam's moments (12 bytes per parameter) live in "
                             "the instance's RAM and cross PCIe every step: slower than keeping them on "
                             "the cards, but it fits far fewer cards.")),
}


def _texts(key: str, tr: Texts | None = None) -> tuple[str, str]:
    label, tradeoff = TEXTS[key]
    tr = texts() if tr is None else tr
    return tr[label], tr[tradeoff]


def one_change_alternatives(job: Job, candidates: list[Candidate], *, vendor: str,
                            site: str | None, in_stock: bool, best: Option | None,
                            estimates: dict | None = None) -> list[Change]:
    """Cheapest first; only changes that beat the recommended plan's monthly price.
    ``estimates``: the job's recommendation's (``recommend(..., estimates=)``): every variant
    changes only the method or the vendor, so the configurations it sizes are shared."""
    limit = best.candidate.monthly_cents if best else None
    estimates = {} if estimates is None else estimates
    out = []
    for key, query, changed, v in _variants(job, vendor):
        def shown(c: Candidate, key: str = key) -> bool:
            if limit is not None and c.monthly_cents >= limit:
                return False
            # the cheapest is still a CUDA card: allowing ROCm changes nothing
            return not (key == "vendor" and c.vendor == "nvidia")

        option = cheapest(changed, candidates, vendor=v, site=site, in_stock=in_stock, estimates=estimates,
                          accept=shown)
        if option is None:
            continue
        # the answer's texts table, which costing the option looked up (``Estimator.tr``)
        label, tradeoff = _texts(key, estimates.get("texts"))
        out.append(Change(key, label, tradeoff, option, query))
    return sorted(out, key=lambda ch: (ch.option.candidate.monthly_cents, ch.key))
