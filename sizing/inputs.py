"""Parse and validate user input (query parameters, form data or a HF config.json).

Every rejection is a :class:`SizingInputError` naming the offending field, so the API can
answer HTTP 400 with the field; nothing else may escape :func:`parse_request`. A pasted
config.json goes through ``sizing.hf_config``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from django.utils.translation import gettext

from .engine import DEFAULT_UTILISATION, LOSSES, METHODS, OFFLOADS, Job
from .errors import SizingInputError
from .frameworks import DEFAULT_FRAMEWORK, FRAMEWORKS
from .frozen import quick_init
from .hf_config import MAX_PARAMS_B, MAX_SEQ, parse_hf_config
from .presets import LINEAR_MODULES, PRESETS, Architecture, infer_llama_shape

MAX_BATCH = 1024
MAX_GPUS = 64
MAX_RANK = 4096
MAX_TOKENS = 10**15
MAX_EPOCHS = 1000.0
VENDORS = ("cuda", "any")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}
#: what counts as not given
_BLANK = (None, "", [])
#: each true or false word, to its meaning
_WORDS = {**dict.fromkeys(_TRUE, True), **dict.fromkeys(_FALSE, False)}
_SHORT_TARGETS = {m.split("_")[0]: m for m in LINEAR_MODULES}


@quick_init  # one or more per answer (sizing.frozen)
@dataclass(frozen=True, slots=True)
class SizingRequest:
    """A validated request: the engine job plus the recommender's filters."""

    job: Job
    vendor: str = "cuda"
    site: str | None = None
    in_stock: bool = False


def _first(value):
    """Query dicts may carry lists (``QueryDict.lists()``); take the last value."""
    if isinstance(value, (list, tuple)) and value and not isinstance(value[0], (list, dict)):
        return value[-1]
    return value


def _number(field: str, value, lo: float, hi: float, integer: bool) -> float | int:
    value = _first(value)
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise SizingInputError(field, gettext("must be a number"))
    try:
        x = float(value.strip()) if isinstance(value, str) else float(value)
    except (ValueError, OverflowError):
        raise SizingInputError(field, gettext("must be a number")) from None
    if not math.isfinite(x):
        raise SizingInputError(field, gettext("must be a finite number"))
    if integer and x != int(x):
        raise SizingInputError(field, gettext("must be a whole number"))
    if not lo <= x <= hi:
        raise SizingInputError(field, gettext("must be between %(lo)s and %(hi)s") % {"lo": f"{lo:g}", "hi": f"{hi:g}"})
    return int(x) if integer else x


#: below this, an integer's float is exact: ``int(float(x)) == x`` (``_number``'s path)
_EXACT_FLOAT_INT = 2**53


def _int(field, value, lo, hi) -> int:
    # the common case, a plain decimal string or an int within the range, without the float
    # round trip; ``_number`` answers (and words the error) for everything else
    if type(value) is str and value.isascii() and value.isdigit():
        x = int(value)
        if lo <= x <= hi and x < _EXACT_FLOAT_INT:
            return x
    elif type(value) is int and lo <= value <= hi and -_EXACT_FLOAT_INT < value < _EXACT_FLOAT_INT:
        return value
    return int(_number(field, value, lo, hi, True))


def _bool(field: str, value) -> bool:
    if type(value) is str and value in _WORDS:  # as a form or query writes it
        return _WORDS[value]
    value = _first(value)
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _WORDS:
        return value.strip().lower() in _TRUE
    raise SizingInputError(field, gettext("must be true or false"))


def _choice(field: str, value, options) -> str:
    if type(value) is str and value in options:  # already one of them, as written
        return value
    value = _first(value)
    if not isinstance(value, str) or value.strip().lower() not in options:
        raise SizingInputError(field, gettext("must be one of %(options)s") % {"options": ", ".join(options)})
    return value.strip().lower()


def parse_targets(value) -> tuple[str, ...]:
    """``all``/``all-linear`` or a list (``q_proj,v_proj`` or ``q,v``) of projections."""
    if value == "all":  # the default, as a query or form gives it
        return LINEAR_MODULES
    if isinstance(value, str):
        items = [v.strip().lower() for v in value.split(",") if v.strip()]
    elif isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        items = [v.strip().lower() for v in value if v.strip()]
    else:
        raise SizingInputError("lora_targets", gettext("must be a comma-separated list of modules"))
    if not items:
        raise SizingInputError("lora_targets", gettext("must name at least one module"))
    if items in (["all"], ["all-linear"], ["all_linear"]):
        return LINEAR_MODULES
    out = []
    for item in items:
        name = _SHORT_TARGETS.get(item, item)
        if name not in LINEAR_MODULES:
            raise SizingInputError("lora_targets", gettext("unknown module %(item)r; use %(modules)s")
                                   % {"item": item, "modules": ", ".join(LINEAR_MODULES)})
        if name not in out:
            out.append(name)
    return tuple(m for m in LINEAR_MODULES if m in out)


def _architecture(params: Mapping) -> Architecture:
    model = params.get("model")
    if type(model) is str and model in PRESETS and params.get("config") in _BLANK \
            and params.get("params") in _BLANK:  # a preset, as the calculator's form gives it
        return PRESETS[model]
    has = {k: params.get(k) not in _BLANK for k in ("config", "model", "params")}
    if has["config"]:
        return parse_hf_config(_first(params["config"]) if not isinstance(
            params["config"], Mapping) else params["config"])
    if has["model"] and has["params"]:
        raise SizingInputError("params", gettext("give either a model preset or params, not both"))
    if has["model"]:
        name = _first(params["model"])
        if not isinstance(name, str) or name.strip().lower() not in PRESETS:
            raise SizingInputError("model", gettext("unknown preset; choose one of %(presets)s")
                                   % {"presets": ", ".join(PRESETS)})
        return PRESETS[name.strip().lower()]
    if has["params"]:
        b = _number("params", params["params"], 0.001, MAX_PARAMS_B, False)
        return infer_llama_shape(round(b * 1e9))
    raise SizingInputError("model", gettext("give a model preset, params (billions) or a config.json"))


def parse_request(params: Mapping) -> SizingRequest:
    """Validate a dict of query parameters / JSON fields into a :class:`SizingRequest`.

    Raises only :class:`SizingInputError` (with the field name).
    """
    if not isinstance(params, Mapping):
        raise SizingInputError("request", gettext("must be an object of parameters"))
    g = params.get
    arch = _architecture(params)
    method = _choice("method", g("method", "qlora"), METHODS)
    gpus = _int("gpus", g("gpus", 1), 1, MAX_GPUS)
    zero_raw = _first(g("zero", 0))
    if isinstance(zero_raw, str) and zero_raw.strip().lower() in ("fsdp", "full_shard"):
        zero_raw = 3
    zero = _int("zero", zero_raw, 0, 3)
    if zero and gpus == 1:
        raise SizingInputError("zero", gettext("ZeRO/FSDP sharding needs more than one GPU"))
    offload = _choice("offload", g("offload", "none"), OFFLOADS)
    if offload != "none" and zero == 0:
        raise SizingInputError("offload", gettext("offload needs a ZeRO stage (zero ≥ 1)"))
    if offload == "all" and zero < 3:
        raise SizingInputError("offload", gettext("offloading parameters needs zero=3"))
    rank = _int("lora_rank", g("lora_rank", 16), 1, min(MAX_RANK, arch.hidden))
    job = Job(
        arch=arch, method=method, seq=_int("seq", g("seq", 2048), 1, MAX_SEQ),
        batch=_int("batch", g("batch", 1), 1, MAX_BATCH),
        checkpointing=_bool("checkpointing", g("checkpointing", True)),
        flash_attention=_bool("flash_attention", g("flash_attention", True)),
        lora_rank=rank, lora_targets=parse_targets(g("lora_targets", "all")),
        gpus=gpus, zero=zero, offload=offload,
        tokens=_int("tokens", g("tokens", 0), 0, MAX_TOKENS),
        epochs=_number("epochs", g("epochs", 1), 0.01, MAX_EPOCHS, False),
        utilisation=_number("utilisation", g("utilisation", DEFAULT_UTILISATION),
                            0.01, 1.0, False),
        framework=_choice("framework", g("framework", DEFAULT_FRAMEWORK), tuple(FRAMEWORKS)),
        loss=_choice("loss", g("loss", "auto"), ("auto", *LOSSES)),
    )
    site = _first(g("site"))
    if site is not None and (not isinstance(site, str) or len(site) > 32):
        raise SizingInputError("site", gettext("must be a site code"))
    return SizingRequest(job=job, vendor=_choice("vendor", g("vendor", "cuda"), VENDORS),
                         site=site.strip().upper() or None if site else None,
                         in_stock=_bool("in_stock", g("in_stock", False)))
