"""HTTP over AMQP 1.0 as RabbitMQ 4's management node speaks it (HTTP over AMQP WD 06; read
in rabbitmq-server's ``rabbit_amqp_management.erl``): the request message (method in
``subject``, target in ``to``, ``reply-to`` ``$me``, an amqp-value body), the response
message, the request target's path and query, percent-decoding of names as RabbitMQ's
``cow_uri:urldecode`` does it, the bodies' maps, and binding locations. The operations are
router/frontend/amqp10_management.py's.

Errors: :class:`HttpError` (the status and text to answer with).
"""
from __future__ import annotations

import base64
import hashlib
import re
from typing import Any
from urllib.parse import parse_qsl, quote, unquote_to_bytes, urlsplit

import msgpack

from shoal.router.amqp10.codec import DecodeError, Described, Typed, decode, encode
from shoal.router.amqp10.convert import PROPERTIES, VALUE, sections, to_field

#: a name segment as RabbitMQ's ``cow_uri:urldecode`` takes it: unreserved, sub-delims, %HH
SEGMENT = re.compile(r"^(?:[A-Za-z0-9\-._~!$&'()*+,;=:@]|%[0-9A-Fa-f]{2})*$")
#: a binding's path segment (DELETE /bindings/...), RabbitMQ's regular expression
BINDING = re.compile(r"^src=([0-9A-Za-z\-._~%]+);dst([eq])=([0-9A-Za-z\-._~%]+);"
                     r"key=([0-9A-Za-z\-._~%]*);args=([0-9A-Za-z\-_]*)$")
_RESPONSE_APP = encode(Described(0x74, {"http:response": "1.1"}))


class HttpError(Exception):
    """An answer with this status (``"404"``) and text, as RabbitMQ's ``throw/3``."""

    def __init__(self, status: str, text: str) -> None:
        super().__init__(text)
        self.status, self.text = status, text


def response(status: str, msg_id: Any, body: Any) -> bytes:
    """The encoded answer: properties (``subject`` the status, ``correlation-id`` the
    request's message-id, a ulong kept a ulong), ``http:response`` "1.1", the amqp-value."""
    if type(msg_id) is int:
        msg_id = Typed("ulong", msg_id)
    props = encode(Described(PROPERTIES, [None, None, None, status, None, msg_id]))
    return props + _RESPONSE_APP + encode(Described(VALUE, body))


def read_request(payload: bytes) -> tuple[Any, str, str, Any]:
    """(message-id, method, target, body) of a request; HttpError 400 when it is not one."""
    props = body = None
    try:
        for code, _, start, end in sections(payload):
            if code == PROPERTIES:
                props = decode(payload, start, end)[0]
            elif code == VALUE:
                body = decode(payload, start, end)[0]
    except DecodeError as exc:
        raise HttpError("400", f"the request is not an AMQP message: {exc}") from None
    props = props if isinstance(props, list) else []
    field = (lambda i: props[i] if len(props) > i else None)
    msg_id, to, subject, reply_to = field(0), field(2), field(3), field(4)
    if not isinstance(to, str) or not isinstance(subject, str):
        raise HttpError("400", "a request needs the properties 'to' (the path) and "
                               "'subject' (the method)")
    if reply_to != "$me":
        raise HttpError("400", "a request's reply-to must be '$me' (the pair's receiving "
                               "link)")
    return msg_id, subject, to, body


def parse_target(target: str) -> tuple[list[str], dict[str, str]]:
    """The raw path segments after the leading "/" and the decoded query."""
    parts = urlsplit(target)
    if not parts.path.startswith("/"):
        raise HttpError("400", f"failed to normalize URI '{target}': not an absolute path")
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    return parts.path[1:].split("/"), query


def segment(raw: str) -> str:
    """A percent-encoded name segment, decoded strictly as RabbitMQ's cow_uri:urldecode."""
    if not SEGMENT.match(raw):
        raise HttpError("400", f"bad percent-encoding in '{raw}'")
    try:
        return unquote_to_bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        raise HttpError("400", f"'{raw}' is not UTF-8 when decoded") from None


def allow(method: str, *allowed: str) -> None:
    """405 unless ``method`` is one of ``allowed`` (RabbitMQ ends the session instead)."""
    if method not in allowed:
        raise HttpError("405", f"method '{method}' not allowed here: {', '.join(allowed)}")


def fields(body: Any, what: str, flags: dict, others: set) -> dict:
    """A queue's or exchange's map: boolean ``flags`` (with their defaults) and ``others``;
    400 "bad queue property ..." for anything else, as RabbitMQ."""
    if body is None:
        body = {}
    if not isinstance(body, dict):
        raise HttpError("400", f"a {what} declaration is a map, not {type(body).__name__}")
    out = dict(flags)
    for k, v in body.items():
        if type(k) is not str or (k in flags and type(v) is not bool) or \
                (k not in flags and k not in others):
            raise HttpError("400", f"bad {what} property {k!r}: {v!r}")
        out[k] = v
    return out


def arguments(args: Any) -> dict:
    """Request arguments as 0-9-1 table values (RabbitMQ 4's conversion)."""
    if args is None:
        return {}
    if not isinstance(args, dict):
        raise HttpError("400", f"arguments are a map, not {type(args).__name__}")
    for k in args:
        if not isinstance(k, str):
            raise HttpError("400", f"unsupported argument {k!r}")
    return {str(k): to_field(v) for k, v in args.items()}


def args_hash(args: dict) -> str:
    """A binding's arguments as its ``args=`` path value: empty for none (clients build
    that path themselves), else 32 bits of a digest of the sorted arguments, base64url
    without padding (RabbitMQ's is Erlang's phash2: clients treat it as opaque)."""
    if not args:
        return ""
    raw = msgpack.packb(sorted(args.items()), default=str)
    digest = hashlib.blake2b(raw, digest_size=4).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def location(src: str, queue: bool, dest: str, key: str, args: dict) -> str:
    """A binding's path: ``/bindings/src=X;dstq=Q;key=K;args=H`` (``dste`` for an exchange),
    each name percent-encoded."""
    return (f"/bindings/src={quote(src, safe='')};dst{'q' if queue else 'e'}="
            f"{quote(dest, safe='')};key={quote(key, safe='')};args={args_hash(args)}")
