"""Look-alike usernames: `аlice` with a Cyrillic а, or `opеrator` with a
Cyrillic е, pass for someone else on a support chat or an operator's screen. Usernames are
NFKC-normalised (Django's normalize_username) and then refused when they mix alphabets
with look-alike letters (Unicode TR39's confusables, from the confusable-homoglyphs
library) or when their skeleton — each look-alike letter replaced by its Latin twin,
case folded — is an existing username. ASCII has look-alikes of its own (`aIice` with a
capital I, `0perator` with a zero, `rn` for `m`): a name whose ASCII skeleton (those folded
too) is an existing username's is refused as well."""
import re
import unicodedata

from confusable_homoglyphs import confusables
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db.models.functions import Length
from django.utils.translation import gettext as _

NOT_ASCII = r"[^\x00-\x7f]"


def skeleton(name: str) -> str:
    name = unicodedata.normalize("NFKC", name).casefold()
    found = confusables.is_confusable(name, greedy=True, preferred_aliases=["latin"]) or []
    twins = {}
    for finding in found:  # only non-ASCII letters with an ASCII twin are replaced
        ascii_twins = [h["c"] for h in finding["homoglyphs"] if h["c"].isascii()]
        if not finding["character"].isascii() and ascii_twins:
            twins[finding["character"]] = ascii_twins[0]
    return "".join(twins.get(ch, ch) for ch in name).casefold()


#: Case-sensitive ASCII look-alikes, folded before case folding (a capital I is an l, a
#: lower-case i is not); then letter pairs that read as one letter.
ASCII_TWINS = str.maketrans({"I": "l", "1": "l", "|": "l", "0": "o", "O": "o"})
ASCII_PAIRS = (("rn", "m"), ("vv", "w"))
#: What each skeleton letter may be in a stored name (over-inclusive; a candidate's own
#: skeleton is compared after the query).
_SKELETON_PATTERN = {"l": "[l1i|]", "o": "[o0]", "m": "(m|rn)", "w": "(w|vv)"}


def ascii_skeleton(name: str) -> str:
    shape = skeleton(unicodedata.normalize("NFKC", name).translate(ASCII_TWINS))
    for pair, letter in ASCII_PAIRS:
        shape = shape.replace(pair, letter)
    return shape


def _same_ascii_skeleton_exists(name: str) -> bool:
    shape = ascii_skeleton(name)
    pattern = "^" + "".join(_SKELETON_PATTERN.get(ch, re.escape(ch)) for ch in shape) + "$"
    candidates = (User.objects.filter(username__iregex=pattern).exclude(username__iexact=name)
                  .values_list("username", flat=True)[:1000])
    return any(ascii_skeleton(other) == shape for other in candidates)


def validate_username_distinct(name: str) -> None:
    if confusables.is_dangerous(name, preferred_aliases=["latin"]):
        raise ValidationError(_("This username mixes alphabets with letters that look alike (such as a Cyrillic "
                                "“а” among Latin letters); write it in one alphabet."), code="confusable")
    shape = skeleton(name)
    if shape != name.casefold() and User.objects.filter(username__iexact=shape).exists():
        raise ValidationError(_("This username looks like an existing one; choose another."), code="confusable")
    if not re.search(NOT_ASCII, name):
        look_alikes = (User.objects.filter(username__regex=NOT_ASCII).annotate(n=Length("username"))
                       .filter(n=len(name)).values_list("username", flat=True)[:1000])
        if any(skeleton(other) == shape for other in look_alikes):
            raise ValidationError(_("This username looks like an existing one; choose another."), code="confusable")
    if _same_ascii_skeleton_exists(name):
        raise ValidationError(_("This username looks like an existing one (I and l, 0 and O, rn and m look alike "
                                "in many fonts); choose another."), code="confusable")
