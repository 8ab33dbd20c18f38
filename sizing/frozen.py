"""Frozen, slotted dataclasses built with less work per field (pure Python, no Django).

A frozen dataclass's own ``__init__`` sets each field with ``object.__setattr__(self, name,
value)``: a method looked up and bound, then the slot found by name, for every field. The
engine builds its estimates, options and speeds by the dozen per answer (an ``Estimate``
has 15 fields), and that was about half the cost of building one. ``quick_init`` gives
the class an ``__init__`` with the same parameters and defaults that sets each slot
through its own descriptor, bound once per class.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, fields
from typing import TypeVar

T = TypeVar("T")

#: the dataclass's own ``__init__`` of each class given a quick one
#: (tests/sizing/test_fast_paths.py holds the two alike)
REPLACED: dict[type, Callable] = {}


def quick_init(cls: type[T]) -> type[T]:
    """Apply above ``@dataclass(frozen=True, slots=True)``; only plain defaults (no
    ``default_factory``, ``init=False``, ``kw_only`` or ``__post_init__``): anything else is a
    TypeError at import rather than an ``__init__`` that differs."""
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__slots__" not in cls.__dict__ or hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__}: quick_init takes a frozen, slotted dataclass without __post_init__")
    namespace: dict = {}
    args, body = [], []
    for f in fields(cls):
        if not f.init or f.kw_only or f.default_factory is not MISSING:
            raise TypeError(f"{cls.__name__}.{f.name}: quick_init takes plain fields and defaults only")
        namespace[f"_set_{f.name}"] = cls.__dict__[f.name].__set__
        if f.default is MISSING:
            args.append(f.name)
        else:
            namespace[f"_default_{f.name}"] = f.default
            args.append(f"{f.name}=_default_{f.name}")
        body.append(f"    _set_{f.name}(self, {f.name})\n")
    exec(f"def __init__(self, {', '.join(args)}):\n{''.join(body)}", namespace)  # noqa: S102 - our own text
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__annotations__ = dict(cls.__init__.__annotations__)
    REPLACED[cls] = cls.__init__
    setattr(cls, "__init__", init)  # noqa: B010 - a method assigned to the class
    return cls
