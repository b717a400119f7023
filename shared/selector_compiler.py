"""Selector text -> a closure ``fn(fields) -> True | False | None``, for
:mod:`shoal.shared.selector`: the two grammars (JMS 1.1 section 3.8.1.1 selectors; the AMQP
SQL filter, OASIS filtex 1.0 section 6 as RabbitMQ 4.2 reads it), their LALR parsers (lark),
and the transformer whose closures carry SQL's three-valued logic (JMS 3.8.1.2).

``shoal.shared.selector`` imports this module when a process compiles its first selector, not
at start-up: lark and the ``regex`` module it brings cost every router and node process about
0.06 s of CPU to import (most never see a selector), and the test suite starts some 450 of
them.

Public: :func:`build` (raises :class:`SelectorSyntaxError`, position counted from 1).
"""
from __future__ import annotations

import functools
import re
import time
from typing import Any, Callable

from lark import Lark, Token, Transformer, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, \
    VisitError


class SelectorSyntaxError(Exception):
    """A selector that does not parse, or whose parts are wrong (a bad ESCAPE): ``pos``
    (counted from 1) and ``why``, for the caller's 406 text."""

    def __init__(self, pos: int, why: str) -> None:
        super().__init__(why)
        self.pos = pos
        self.why = why


_KEYWORDS = "and|or|not|between|like|escape|in|is|null|true|false"

_GRAMMAR = r"""
?start: or_expr
?or_expr: and_expr | or_expr OR and_expr -> or_
?and_expr: not_expr | and_expr AND not_expr -> and_
?not_expr: predicate | NOT not_expr -> not_
?predicate: sum
    | sum COMPOP sum -> compare
    | sum NOT? BETWEEN sum AND sum -> between
    | sum NOT? LIKE STRING (ESCAPE STRING)? -> like
    | sum NOT? IN "(" literal ("," literal)* ")" -> in_
    | sum IS NOT? NULL -> is_null
?sum: product | sum ADDOP product -> arith
?product: unary | product MULOP unary -> arith
?unary: primary | ADDOP unary -> neg
?primary: literal | IDENT -> ident | "(" or_expr ")"
literal: STRING -> string | NUMBER -> number | TRUE -> true | FALSE -> false

OR.2: /or\b/i
AND.2: /and\b/i
NOT.2: /not\b/i
BETWEEN.2: /between\b/i
LIKE.2: /like\b/i
ESCAPE.2: /escape\b/i
IN.2: /in\b/i
IS.2: /is\b/i
NULL.2: /null\b/i
TRUE.2: /true\b/i
FALSE.2: /false\b/i
IDENT: /(?!(?:""" + _KEYWORDS + r""")\b)[A-Za-z_$][A-Za-z0-9_$.]*/i
STRING: /'(?:[^']|'')*'/
NUMBER: /0[xX][0-9a-fA-F]+|(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?[lLfFdD]?/
COMPOP: "<>" | "<=" | ">=" | "=" | "<" | ">"
ADDOP: "+" | "-"
MULOP: "*" | "/"
%import common.WS
%ignore WS
"""


#: The SQL filter's grammar: the selector's, with filtex's additions (module docstring).
_SQL_GRAMMAR = _GRAMMAR \
    .replace('?primary: literal | IDENT -> ident | "(" or_expr ")"',
             '?primary: literal | IDENT -> ident | DELIMITED -> delimited '
             '| UTC "(" ")" -> utc | "(" or_expr ")"') \
    .replace("literal: STRING -> string | NUMBER -> number |",
             "literal: STRING -> string | NUMBER -> number | BINARY -> binary |") \
    .replace("STRING: /'(?:[^']|'')*'/", "STRING: /'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"/") \
    .replace("NUMBER: /0[xX][0-9a-fA-F]+|", "NUMBER: /") \
    .replace('COMPOP: "<>" |', 'COMPOP: "<>" | "!=" |') \
    .replace('MULOP: "*" | "/"', 'MULOP: "*" | "/" | "%"') \
    .replace(_KEYWORDS, _KEYWORDS + "|utc") \
    + "\nBINARY.3: /0x(?:[0-9A-Fa-f]{2})+/\nDELIMITED: /\\[(?:[^\\[\\]]|\\[\\[|\\]\\])*\\]/\n" \
    "UTC.2: /utc\\b/i\n"


@functools.cache
def _parser(sql: bool) -> Lark:
    """The selector's (or with ``sql`` the SQL filter's) LALR parser, built at its first use:
    building one takes about 0.1 s, which every router and node process paid at start-up
    although most never see a selector."""
    return Lark(_SQL_GRAMMAR if sql else _GRAMMAR, parser="lalr", maybe_placeholders=False)

Fn = Callable[[dict], Any]


def _number(text: str) -> int | float:
    t = text.rstrip("lLfFdD") if not text.lower().startswith("0x") else text
    if t.lower().startswith("0x"):
        return int(t, 16)
    if re.fullmatch(r"\d+", t):
        return int(t)
    return float(t)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _and(a: Any, b: Any) -> Any:
    if a is False or b is False:
        return False
    if a is None or b is None:
        return None
    return True


def _or(a: Any, b: Any) -> Any:
    if a is True or b is True:
        return True
    if a is None or b is None:
        return None
    return False


def _compare(op: str, a: Any, b: Any) -> Any:
    if a is None or b is None:
        return None
    if _is_num(a) and _is_num(b):
        pass
    elif type(a) is not type(b):
        return False
    elif isinstance(a, bool) and op not in ("=", "<>"):
        return None
    if op == "=":
        return a == b
    if op == "<>":
        return a != b
    if isinstance(a, str) and op not in ("=", "<>"):
        return False           # JMS: strings and booleans compare with = and <> only
    if op == "<":
        return a < b
    if op == "<=":
        return a <= b
    if op == ">":
        return a > b
    return a >= b


def _like_regex(pattern: str, escape: str | None) -> re.Pattern:
    out = []
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if escape is not None and ch == escape and i + 1 < len(pattern):
            out.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        out.append(".*" if ch == "%" else "." if ch == "_" else re.escape(ch))
        i += 1
    return re.compile("".join(out), re.DOTALL)


class _SelectorError(Exception):
    """Raised inside the transformer for a semantic error (a bad ESCAPE)."""


def _unquote(tok: Token) -> str:
    q = tok[0]
    return tok[1:-1].replace(q + q, q)


@v_args(inline=True)
class _Compile(Transformer):
    """Turns the parse tree into a closure ``fn(fields) -> True | False | None``; ``sql``:
    the SQL filter's arithmetic (module docstring)."""

    def __init__(self, sql: bool = False) -> None:
        super().__init__()
        self.sql = sql

    def string(self, tok: Token) -> Fn:
        value = _unquote(tok)
        return lambda f: value

    def binary(self, tok: Token) -> Fn:
        value = bytes.fromhex(str(tok)[2:])
        return lambda f: value

    def delimited(self, tok: Token) -> Fn:
        name = str(tok)[1:-1].replace("]]", "]").replace("[[", "[")
        return lambda f: f.get(name)

    def utc(self, _tok: Token) -> Fn:
        return lambda f: int(time.time() * 1000)

    def number(self, tok: Token) -> Fn:
        value = _number(str(tok))
        return lambda f: value

    def true(self, tok: Token) -> Fn:
        return lambda f: True

    def false(self, tok: Token) -> Fn:
        return lambda f: False

    def ident(self, tok: Token) -> Fn:
        name = str(tok)
        return lambda f: f.get(name)

    def or_(self, a: Fn, _op: Token, b: Fn) -> Fn:
        return lambda f: _or(a(f), b(f))

    def and_(self, a: Fn, _op: Token, b: Fn) -> Fn:
        return lambda f: _and(a(f), b(f))

    def not_(self, _op: Token, a: Fn) -> Fn:
        def fn(f: dict) -> Any:
            v = a(f)
            return None if v is None or not isinstance(v, bool) else not v
        return fn

    def compare(self, a: Fn, op: Token, b: Fn) -> Fn:
        o = "<>" if str(op) == "!=" else str(op)
        return lambda f: _compare(o, a(f), b(f))

    def arith(self, a: Fn, op: Token, b: Fn) -> Fn:
        o = str(op)
        sql = self.sql

        def fn(f: dict) -> Any:
            x, y = a(f), b(f)
            if not (_is_num(x) and _is_num(y)):
                return None
            if o == "+":
                return x + y
            if o == "-":
                return x - y
            if o == "*":
                return x * y
            if y == 0:
                return None
            if o == "%":        # SQL filter: integers, Erlang's rem (the dividend's sign)
                if not (isinstance(x, int) and isinstance(y, int)):
                    return None
                r = abs(x) % abs(y)
                return -r if x < 0 else r
            if sql:
                return x / y
            return x / y if isinstance(x, float) or isinstance(y, float) or x % y else x // y
        return fn

    def neg(self, op: Token, a: Fn) -> Fn:
        if str(op) == "+":
            return lambda f: a(f) if _is_num(a(f)) else None
        return lambda f: -a(f) if _is_num(a(f)) else None

    def between(self, a: Fn, *rest: Any) -> Fn:
        negate = isinstance(rest[0], Token) and rest[0].type == "NOT"
        lo, hi = [r for r in rest if not isinstance(r, Token)]

        def fn(f: dict) -> Any:
            v = a(f)
            r = _and(_compare(">=", v, lo(f)), _compare("<=", v, hi(f)))
            return (None if r is None else not r) if negate else r
        return fn

    def like(self, a: Fn, *rest: Any) -> Fn:
        toks = [t for t in rest if t.type == "STRING"]
        negate = any(t.type == "NOT" for t in rest)
        pattern = _unquote(toks[0])
        escape = _unquote(toks[1]) if len(toks) > 1 else None
        if escape is not None and len(escape) != 1:
            raise _SelectorError(f"ESCAPE must be one character, not '{escape}'")
        rx = _like_regex(pattern, escape)

        def fn(f: dict) -> Any:
            v = a(f)
            if not isinstance(v, str):
                return None
            r = rx.fullmatch(v) is not None
            return not r if negate else r
        return fn

    def in_(self, a: Fn, *rest: Any) -> Fn:
        negate = isinstance(rest[0], Token) and rest[0].type == "NOT"
        values = [r({}) for r in rest if not isinstance(r, Token)]

        def fn(f: dict) -> Any:
            v = a(f)
            if v is None:
                return None
            r = any(_compare("=", v, x) is True for x in values)
            return not r if negate else r
        return fn

    def is_null(self, a: Fn, *rest: Token) -> Fn:
        negate = any(t.type == "NOT" for t in rest)
        return lambda f: (a(f) is not None) if negate else (a(f) is None)


def build(text: str, sql: bool) -> Fn:
    """Parse ``text`` as a JMS selector (``sql``: as an SQL filter expression) and return its
    closure over a fields dict. Raises :class:`SelectorSyntaxError`."""
    try:
        tree = _parser(sql).parse(text)
        return _Compile(sql).transform(tree)
    except UnexpectedCharacters as e:
        raise SelectorSyntaxError(e.column, f"unexpected character '{text[e.pos_in_stream]}'") \
            from None
    except UnexpectedEOF:
        raise SelectorSyntaxError(len(text) + 1, "unexpected end of selector") from None
    except UnexpectedInput as e:
        tok = getattr(e, "token", None)
        if tok is not None and getattr(tok, "type", "") == "$END":
            raise SelectorSyntaxError(len(text) + 1, "unexpected end of selector") from None
        raise SelectorSyntaxError(e.column if e.column and e.column > 0 else 1,
                                  f"unexpected '{tok}'" if tok is not None else "syntax error") \
            from None
    except VisitError as e:
        raise SelectorSyntaxError(1, str(e.orig_exc)) from None
