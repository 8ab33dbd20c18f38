"""A customer's image reference (desired item `image_ref`), checked before anything asks
dockerd about it: a malformed one is `image_not_found` with a message saying why. No
Docker import here: the converge loop uses it whatever the runtime."""
import re

from .interfaces import OperationFailed

# A Docker image reference (distribution/reference's grammar, without the normalisation
# of short Docker Hub names, which dockerd does itself).
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REFERENCE = re.compile(
    rf"(?:(?P<domain>(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*"
    rf"[a-zA-Z0-9])?)*(?::[0-9]+)?)/)?(?P<path>{_COMPONENT}(?:/{_COMPONENT})*)"
    r"(?::(?P<tag>[\w][\w.-]{0,127}))?(?:@(?P<digest>sha256:[0-9a-f]{64}))?", re.ASCII)


def normalise_reference(ref) -> str:
    """A valid reference with its tag (`:latest` when none and no digest), or
    OperationFailed `image_not_found` saying what is wrong with it."""
    if not isinstance(ref, str) or not ref or len(ref) > 512:
        raise OperationFailed("image_not_found", f"{str(ref)[:80]!r} is not an image reference")
    match = _REFERENCE.fullmatch(ref)
    if match is None:
        raise OperationFailed("image_not_found", f"{ref[:200]!r} is not a valid image reference "
                              "(expected e.g. registry.example/team/name:tag, in lower case)")
    if match["tag"] is None and match["digest"] is None:
        return f"{ref}:latest"
    return ref
