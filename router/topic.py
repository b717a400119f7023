"""Topic exchange matching (AMQP 0-9-1 spec 3.1.3.3: ``*`` one word, ``#`` zero or more
words, words separated by ``.``).

:class:`TopicTrie` indexes an exchange's bindings by the words of their keys, as RabbitMQ's
``rabbit_exchange_type_topic`` does with its trie of edges: a publish walks only the edges
its routing key's words (and ``*``, ``#``) lead to, so its cost grows with the key's length
and the patterns that share its words, not with the exchange's binding count (a scan ran a
regular expression per binding: 1,000 bindings held Shoal to about 3,500 msg/s on this
machine, issue 46 shape F). :func:`compile_topic` is the same rule for one key, a regular
expression; the trie is tested against it.
"""
from __future__ import annotations

import re
from typing import Any, Callable


def pattern_words(pattern: str) -> list[str]:
    """A binding key's words, ``#.#`` (and longer runs) folded into one ``#``."""
    words: list[str] = []
    for word in pattern.split("."):
        if not (word == "#" and words and words[-1] == "#"):
            words.append(word)
    return words


def compile_topic(pattern: str) -> Callable[[str], bool]:
    """Compile a topic binding key into a predicate over routing keys (spec 3.1.3.3)."""
    words = pattern_words(pattern)
    if "*" not in words and "#" not in words:
        return pattern.__eq__
    regex = ""
    for i, word in enumerate(words):
        if word == "#":
            if i == 0:
                regex += ".*" if len(words) == 1 else r"(?:.*\.)?"
            else:
                regex += r"(?:\..*)?"
            continue
        if i > 0 and not (i == 1 and words[0] == "#"):
            regex += r"\."
        regex += r"[^.]*" if word == "*" else re.escape(word)
    compiled = re.compile(regex + r"\Z", re.DOTALL)
    return lambda key: compiled.match(key) is not None


class _Node:
    __slots__ = ("edges", "items")

    def __init__(self) -> None:
        self.edges: dict[str, _Node] = {}
        self.items: list[Any] = []


class TopicTrie:
    """Items (an exchange's bindings) by topic pattern. ``add(pattern, item)``,
    ``remove(pattern, item)`` (by identity), ``match(routing_key)``: every item whose pattern
    matches, each once."""

    __slots__ = ("root",)

    def __init__(self) -> None:
        self.root = _Node()

    def add(self, pattern: str, item: Any) -> None:
        node = self.root
        for word in pattern_words(pattern):
            nxt = node.edges.get(word)
            if nxt is None:
                nxt = node.edges[word] = _Node()
            node = nxt
        node.items.append(item)

    def remove(self, pattern: str, item: Any) -> None:
        path = [self.root]
        words = pattern_words(pattern)
        for word in words:
            nxt = path[-1].edges.get(word)
            if nxt is None:
                return
            path.append(nxt)
        items = path[-1].items
        for i, x in enumerate(items):
            if x is item:
                del items[i]
                break
        for depth in range(len(words), 0, -1):      # prune the edges left empty
            node = path[depth]
            if node.items or node.edges:
                break
            del path[depth - 1].edges[words[depth - 1]]

    def match(self, routing_key: str) -> list[Any]:
        found: dict[int, Any] = {}
        _walk(self.root, routing_key.split("."), 0, found)
        return list(found.values())


def _walk(node: _Node, words: list[str], i: int, found: dict[int, Any]) -> None:
    n = len(words)
    while True:
        edges = node.edges
        if edges:
            rest = edges.get("#")
            if rest is not None:            # zero or more words: every place it may end
                for j in range(i, n + 1):
                    _walk(rest, words, j, found)
        if i == n:
            for item in node.items:
                found[id(item)] = item
            return
        if not edges:
            return
        one = edges.get("*")
        if one is not None:
            _walk(one, words, i + 1, found)
        node = edges.get(words[i])
        if node is None:
            return
        i += 1
