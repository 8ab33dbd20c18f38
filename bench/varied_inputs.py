"""The calculator's varied inputs (the same generator as bench/varied.lua): a random model,
method, sequence length, micro-batch and vendor, and three times in ten training tokens, so
the render memo rarely answers. Shared by bench/calculator_varied.py (in process) and
bench/store.py's customers (over HTTP). Pure Python: the presets, no Django."""
import random
from urllib.parse import urlencode

from sizing.engine import METHODS
from sizing.presets import PRESETS

SEQS = (256, 512, 1024, 2048, 3072, 4096, 8192)
BATCHES = (1, 2, 4, 8, 16)


def varied_queries(n: int, seed: int = 31) -> list[str]:
    """n distinct random calculator queries (the same generator as bench/varied.lua)."""
    rng = random.Random(seed)
    models, seen, out = sorted(PRESETS), set(), []
    while len(out) < n:
        q = {"model": rng.choice(models), "method": rng.choice(METHODS), "seq": rng.choice(SEQS),
             "batch": rng.choice(BATCHES), "vendor": rng.choice(("cuda", "any"))}
        if rng.random() < 0.3:
            q["tokens"] = rng.choice((10**7, 2 * 10**7, 10**8))
        key = urlencode(q)
        if key not in seen:
            seen.add(key)
            out.append(key)
    return out
