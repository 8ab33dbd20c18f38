"""The calculator's form: field names are the API's query parameters, so a page URL and
an API call carry the same inputs. Validation is the engine's (``parse_request``); the
form only renders the fields and places the engine's error next to the right one."""

import copy

from django import forms
from django.utils.translation import gettext_lazy as _

from .engine import METHODS
from .figures import PAGE_QUERY
from .frameworks import FRAMEWORKS
from .inputs import MAX_BATCH, MAX_GPUS, MAX_RANK, MAX_SEQ
from .presets import PRESETS

#: the 13B LoRA example, shown when the page is opened without a query
#: (its memory assumptions are the pages' one set, sizing.figures.PAGE_QUERY)
DEFAULTS = {"model": "llama-2-13b", "method": "lora", **PAGE_QUERY, "gpus": 1, "zero": "0", "offload": "none",
            "epochs": 1, "vendor": "cuda"}

METHOD_LABELS = {"full": _("Full fine-tune (AdamW, 16 B/param)"),
                 "full-8bit": _("Full, 8-bit optimizer (10 B/param)"),
                 "lora": _("LoRA (bf16 base)"), "qlora": _("QLoRA (4-bit base)")}
ON_OFF = [("on", _("On")), ("off", _("Off"))]


def _number(label, lo, hi, step="1", help_text=""):
    """A text-validated number input: the engine gives the error message, not Django."""
    attrs = {"min": lo, "max": hi, "step": step, "inputmode": "decimal"}
    return forms.CharField(label=label, required=False, help_text=help_text,
                           widget=forms.NumberInput(attrs=attrs))


class SizingForm(forms.Form):
    """Every field optional: a blank or missing value means the engine's default."""

    model = forms.ChoiceField(label=_("Model preset"), required=False, choices=[
        ("", _("— none: use params or config.json —"))] + [(k, k) for k in PRESETS])
    params = _number(_("…or parameters (billions)"), 0, 2000, "any",
                     _("Leave the preset empty to use this."))
    config = forms.CharField(
        label=_("…or paste a config.json"), required=False, max_length=64 * 1024,
        widget=forms.Textarea(attrs={"rows": 3, "spellcheck": "false"}),
        help_text=_("Hugging Face config.json; it overrides the preset and params."))
    method = forms.ChoiceField(label=_("Method"), required=False, choices=[(m, METHOD_LABELS[m]) for m in METHODS])
    seq = _number(_("Sequence length"), 1, MAX_SEQ, help_text=_(
        "The packed length with sequence packing; else the longest sample (batches pad to it)."))
    batch = _number(_("Micro-batch"), 1, MAX_BATCH, help_text=_(
        "Sequences per step per GPU; tokens per step = micro-batch × sequence length."))
    checkpointing = forms.ChoiceField(label=_("Gradient checkpointing"), required=False, choices=ON_OFF)
    flash_attention = forms.ChoiceField(label=_("FlashAttention"), required=False, choices=ON_OFF)
    framework = forms.ChoiceField(
        label=_("Training stack"), required=False,
        choices=[(key, f.label) for key, f in FRAMEWORKS.items()],
        help_text=_("Decides the loss's memory and the 4-bit path's buffers. Not sure? Keep Hugging Face: "
                    "it is the heaviest, so the card will fit."))
    lora_rank = _number(_("LoRA rank"), 1, MAX_RANK)
    lora_targets = forms.CharField(label=_("LoRA targets"), required=False, max_length=200,
                                   help_text=_("all, or e.g. q_proj,v_proj"))
    gpus = _number(_("GPUs"), 1, MAX_GPUS)
    zero = forms.ChoiceField(label=_("ZeRO stage"), required=False, choices=[
        ("0", _("0 (none)")), ("1", "1"), ("2", "2"), ("3", _("3 / FSDP full shard"))])
    offload = forms.ChoiceField(label=_("Offload to host"), required=False, choices=[
        ("none", _("None")), ("optimizer", _("Optimizer states")), ("all", _("Everything"))])
    tokens = _number(_("Training tokens"), 0, 10**15, "1",
                     _("For the run-time estimate, e.g. 20000000."))
    epochs = _number(_("Epochs"), 0.01, 1000, "any")
    vendor = forms.ChoiceField(label=_("Vendor"), required=False, choices=[
        ("cuda", _("CUDA only (NVIDIA)")), ("any", _("ROCm allowed (AMD too)"))])
    site = forms.ChoiceField(label=_("Site"), required=False)
    in_stock = forms.BooleanField(label=_("In stock only"), required=False)

    def __init__(self, *args, sites=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["site"].choices = [("", _("Any site"))] + [(s, s) for s in sites]

    def engine_params(self) -> dict:
        """The validated values as the engine's parameters (blank = default)."""
        data = dict(self.cleaned_data)
        data["in_stock"] = "true" if data.get("in_stock") else "false"
        return data

    def add_engine_error(self, field: str, message: str) -> None:
        """Put an engine error next to its field (``config.hidden_size`` → config)."""
        name = field.split(".")[0]
        if field.startswith("config."):
            message = f"{field.removeprefix('config.')}: {message}"
        self.add_error(name if name in self.fields else None, message)


class _SharedFields(dict):
    """``SizingForm.base_fields``: Django deep-copies a form's fields for every instance so
    that one form's changes do not leak into the next; for this form that copy (~20 fields
    with their widgets and ~50 model choices) was a third of a cold calculator answer's
    engine time. Nothing changes a field after the class is built except the
    site choices, set per instance (``SizingForm.__init__``), so only the fields named in
    ``per_instance`` are copied; the rest are shared, read-only."""

    per_instance = ("site",)

    def __deepcopy__(self, memo):
        fields = dict(self)
        for name in self.per_instance:
            fields[name] = copy.deepcopy(self[name], memo)
        return fields


SizingForm.base_fields = _SharedFields(SizingForm.base_fields)


def _fast_rules() -> dict:
    """Per field, what ``quick_engine_params`` checks: ('choice', valid values), ('text',
    max length or None) or ('bool',). Read off the fields, so a field added with another
    type or validator is noticed (``TypeError`` at import) rather than skipped."""
    rules = {}
    for name, f in SizingForm.base_fields.items():
        if f.required:
            raise TypeError(f"{name}: quick_engine_params assumes optional fields")
        if isinstance(f, forms.BooleanField) and type(f.widget) is forms.CheckboxInput:
            rules[name] = ("bool",)
        elif type(f) is forms.ChoiceField and type(f.widget) is forms.Select:
            rules[name] = ("choice", None if name == "site" else frozenset(str(k) for k, _ in f.choices))
        elif type(f) is forms.CharField and f.strip and f.empty_value == "" and len(f.validators) == (
                1 if f.max_length is None else 2):
            rules[name] = ("text", f.max_length)
        else:
            raise TypeError(f"{name}: quick_engine_params does not know {type(f).__name__}")
    return rules


_RULES = _fast_rules()


def quick_engine_params(data, sites) -> dict | None:
    """``SizingForm(data, sites=sites).engine_params()`` when that form is valid, without
    building the form (the form's construction and ``full_clean`` were a sixth of
    a cold htmx answer, which shows no form); None when the form would have an error, so
    that the caller builds the form and shows it. Each field is read and cleaned as its
    widget and field do: the last value of the key, stripped text (at most max_length, no
    NUL), a choice among the field's values, a checkbox's "false" as off."""
    cleaned = {}
    for name, rule in _RULES.items():
        # a QueryDict's get raises and catches two KeyErrors for a missing name (most are)
        value = data.get(name) if name in data else None
        if rule[0] == "bool":
            if name not in data:
                cleaned[name] = False
                continue
            if isinstance(value, str):  # CheckboxInput; BooleanField keeps the bool it gives
                value = {"true": True, "false": False}.get(value.lower(), value)
            cleaned[name] = bool(value)
            continue
        text = "" if value in (None, "", [], (), {}) else str(value)
        if rule[0] == "text":
            text = text.strip()
            if "\x00" in text or (rule[1] is not None and len(text) > rule[1]):
                return None
        elif text and text not in (rule[1] if rule[1] is not None else sites):
            return None
        cleaned[name] = text
    cleaned["in_stock"] = "true" if cleaned.get("in_stock") else "false"
    return cleaned
