"""Answers kept on the object they are about, for as long as that object lives.

A page's templates ask the same question of one lease more than once per render (the status
block and the instance block each want the instance; the timeline and the record links each
want the sanitization record), and each template tag would query again. The lease is loaded
per request, so an answer kept on it lives for one render and is never stale across requests.
"""
import functools

_PREFIX = "_memo_on_instance:"


def memo_on_instance(func):
    """`func(obj)`'s answer, computed once per `obj` (kept in `obj.__dict__`). Only for
    functions of the object alone that read and never write. An object with nowhere to keep
    it (a template passing "" for a lease it does not have) is answered each time."""
    key = f"{_PREFIX}{func.__module__}.{func.__qualname__}"

    @functools.wraps(func)
    def once(obj):
        kept = getattr(obj, "__dict__", None)
        if kept is None:
            return func(obj)
        if key not in kept:
            kept[key] = func(obj)
        return kept[key]

    return once
