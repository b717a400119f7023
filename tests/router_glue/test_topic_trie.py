"""The topic exchange's trie (router/topic.py) routes exactly as the spec's rule, written as a
regular expression per binding (``compile_topic``), on any patterns and keys."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.router.topic import TopicTrie, compile_topic

WORDS = st.sampled_from(["a", "b", "", "ab"])
PATTERN_WORDS = st.sampled_from(["a", "b", "", "ab", "*", "#"])
keys = st.lists(WORDS, min_size=1, max_size=5).map(".".join)
patterns = st.lists(PATTERN_WORDS, min_size=1, max_size=5).map(".".join)


@settings(max_examples=400, deadline=None)
@given(st.lists(patterns, max_size=12), st.lists(keys, min_size=1, max_size=6), st.data())
def test_the_trie_matches_what_the_rule_matches(pats, routing_keys, data):
    trie = TopicTrie()
    items = [(p, object()) for p in pats]
    for p, item in items:
        trie.add(p, item)
    removed = data.draw(st.sets(st.integers(0, max(0, len(items) - 1))) if items else st.just(set()))
    for i in removed:
        trie.remove(*items[i])
    kept = [(p, item) for i, (p, item) in enumerate(items) if i not in removed]
    for key in routing_keys:
        want = {id(item) for p, item in kept if compile_topic(p)(key)}
        got = trie.match(key)
        assert {id(x) for x in got} == want, (key, [p for p, _ in kept])
        assert len(got) == len(want)            # each binding once, however many paths


def test_removing_the_last_binding_prunes_its_edges():
    trie = TopicTrie()
    one, two = object(), object()
    trie.add("a.*.#", one)
    trie.add("a.b", two)
    trie.remove("a.*.#", one)
    assert list(trie.root.edges) == ["a"] and list(trie.root.edges["a"].edges) == ["b"]
    trie.remove("a.b", two)
    assert trie.root.edges == {} and trie.match("a.b") == []
    trie.remove("x.y", one)                     # unknown: nothing happens
