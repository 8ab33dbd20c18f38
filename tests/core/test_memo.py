"""core.memo.memo_on_instance: an answer computed once per object, never shared between objects."""
from core.memo import memo_on_instance


class Thing:
    def __init__(self, name):
        self.name = name


def test_an_answer_is_computed_once_per_object_and_kept_apart_per_object():
    calls = []

    @memo_on_instance
    def shout(thing):
        calls.append(thing.name)
        return thing.name.upper()

    a, b = Thing("a"), Thing("b")
    assert [shout(a), shout(a), shout(b), shout(a)] == ["A", "A", "B", "A"]
    assert calls == ["a", "b"]


def test_two_functions_keep_their_answers_apart_on_one_object():
    @memo_on_instance
    def first(thing):
        return 1

    @memo_on_instance
    def second(thing):
        return 2

    thing = Thing("x")
    assert (first(thing), second(thing), first(thing)) == (1, 2, 1)


def test_a_none_answer_is_kept_too():
    calls = []

    @memo_on_instance
    def nothing(thing):
        calls.append(1)

    thing = Thing("x")
    assert (nothing(thing), nothing(thing)) == (None, None) and calls == [1]


def test_an_object_with_nowhere_to_keep_it_is_answered_each_time():
    calls = []

    @memo_on_instance
    def length(value):
        calls.append(value)
        return len(value)

    assert (length(""), length("")) == (0, 0) and calls == ["", ""]
