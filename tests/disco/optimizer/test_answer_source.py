"""Where the answer came from, as the report's "from:" line says it (disco.optimizer._answer._source)."""

from types import SimpleNamespace

from disco.optimizer._answer import _source


def _result(**row):
    fields = {"kind": "candidate", "name": "b1_ynn-noreduce_d1952a", "found_as": None, "measured_in": "screen",
              "origin": ""}
    r = SimpleNamespace(**{**fields, **row})
    return SimpleNamespace(chosen=r.name, row=lambda name: r)


def test_a_reference_answers_origin_and_its_search_name_are_separated():
    got = _source(_result(origin="b1_g201_ynn-noreduce_3b7dbd without its fusion groups", found_as="disco_5_buckets"))
    assert got == ("reference", "b1_g201_ynn-noreduce_3b7dbd without its fusion groups, found as disco_5_buckets")


def test_a_reference_answer_with_no_origin_says_only_where_it_was_found():
    assert _source(_result(found_as="disco_5_buckets")) == ("reference", "found as disco_5_buckets")
    assert _source(_result(origin="greedy_fusion")) == ("reference", "greedy_fusion")
