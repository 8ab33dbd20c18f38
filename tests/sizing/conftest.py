"""The first document's default catalog as recommender candidates (no database)."""

import pytest

from sizing.recommend import Candidate

SITES = {"DFW-1": 3, "IAD-1": 2, "PDX-1": 1}

# slug, name, gpu, vendor, gpus, vram, link, week¢, month¢, bf16 dense TFLOPS per GPU
_ROWS = [
    ("h100-sxm", "H100 SXM", "H100 SXM", "nvidia", 1, 80, "nvswitch", 47500, 169000, 989),
    ("a100-sxm", "A100 SXM", "A100 SXM", "nvidia", 1, 80, "nvswitch", 28000, 99000, 312),
    ("h200-sxm", "H200 SXM", "H200 SXM", "nvidia", 1, 141, "nvswitch", 64000, 229000, 989),
    ("mi300x", "MI300X", "MI300X", "amd", 1, 192, "infinity_fabric", 45000, 159000, 1307),
    ("l40s", "L40S", "L40S", "nvidia", 1, 48, "pcie_p2p", 14800, 52000, 362),
    ("rtx-a6000", "RTX A6000", "RTX A6000", "nvidia", 1, 48, "nvlink_bridge", 8200, 29000, 155),
    ("rtx-3090", "RTX 3090", "RTX 3090", "nvidia", 1, 24, "nvlink_bridge", 6500, 23000, 71),
    ("rtx-a5000", "RTX A5000", "RTX A5000", "nvidia", 1, 24, "nvlink_bridge", 5500, 19000, 111),
    ("rtx-4090", "RTX 4090", "RTX 4090", "nvidia", 1, 24, "pcie", 11000, 39000, 165),
    ("a40", "A40", "A40", "nvidia", 1, 48, "nvlink_bridge", 6800, 24000, 150),
    ("2x-a100-sxm", "2× A100 SXM", "A100 SXM", "nvidia", 2, 80, "nvswitch", 53200, 188100, 312),
    ("8x-mi300x", "8× MI300X", "MI300X", "amd", 8, 192, "infinity_fabric", 324000, 1145000,
     1307),
    ("8x-h100-sxm", "8× H100 SXM", "H100 SXM", "nvidia", 8, 80, "nvswitch", 344000, 1217000,
     989),
]


def build_catalog() -> list[Candidate]:
    return [Candidate(*row, free_by_site=dict(SITES)) for row in _ROWS]


@pytest.fixture
def catalog() -> list[Candidate]:
    return build_catalog()
