"""VRAM sizing engine and GPU recommender (pure Python; no Django imports here).

Public API::

    parse_request(dict) -> SizingRequest          # raises SizingInputError(field, message)
    estimate(job: Job) -> Estimate                 # Estimate.to_dict()
    recommend(job, candidates, vendor=, site=, in_stock=) -> Recommendation
    overbuy_warning(estimate, candidate) -> str | None
"""

from .engine import Estimate, Job, train_flops, train_hours, zero_bytes_per_param
from .errors import SizingInputError
from .estimation import estimate
from .hf_config import parse_hf_config
from .inputs import SizingRequest, parse_request
from .presets import PRESETS, Architecture, infer_llama_shape
from .recommend import (
    Candidate,
    Option,
    Recommendation,
    overbuy_warning,
    recommend,
    usable_gb,
)

__all__ = [
    "PRESETS", "Architecture", "Candidate", "Estimate", "Job", "Option", "Recommendation",
    "SizingInputError", "SizingRequest", "estimate", "infer_llama_shape", "overbuy_warning",
    "parse_hf_config", "parse_request", "recommend", "train_flops", "train_hours",
    "usable_gb", "zero_bytes_per_param",
]
