"""A plain query string (ASCII, no "%" escape, no "+") is read into ``request.GET`` without
Django's per-field parse (storefront.middleware.plain_query); it must be the QueryDict that
Django builds: the same fields, values, order, encoding and immutability."""

from django.http import QueryDict
from django.test import override_settings
from hypothesis import given, settings
from hypothesis import strategies as st

from storefront.middleware import plain_query

PARTS = st.text(alphabet="ab=&%+;\x00é1 ", max_size=30)


def _same(query: str, encoding: str | None) -> None:
    fast = plain_query(query, encoding)
    if fast is None:
        return
    django = QueryDict(query.encode("iso-8859-1"), encoding=encoding)
    assert list(fast.lists()) == list(django.lists())
    assert fast.encoding == django.encoding
    assert fast._mutable is False


@settings(max_examples=2000, deadline=None)
@given(query=st.one_of(PARTS, st.text(max_size=40)), encoding=st.sampled_from([None, "utf-8", "iso-8859-1"]))
def test_a_plain_query_is_the_querydict_django_builds(query, encoding):
    _same(query, encoding)


def test_the_calculators_query_is_plain():
    query = "model=llama-2-7b&method=full&seq=3072&batch=2&vendor=cuda&tokens=100000000&in_stock=&x"
    assert plain_query(query, None) is not None
    _same(query, None)


def test_escapes_plus_and_non_ascii_go_to_django():
    for query in ("a=%00", "a=b+c", "a=é", ""):
        assert plain_query(query, None) is None


@override_settings(DATA_UPLOAD_MAX_NUMBER_FIELDS=3)
def test_too_many_fields_go_to_django():
    assert plain_query("a=1&b=2&c=3", None) is not None
    assert plain_query("a=1&b=2&c=3&d=4", None) is None
    assert plain_query("a=1&&&", None) is None  # parse_qsl counts the separators
