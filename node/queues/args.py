"""Queue-declare and consume arguments: parsed and checked once, into :class:`QueueConfig` and
:class:`ConsumerConfig` (docs/queues.md lists every argument).

Names follow their origin: Qpid Broker-J (seed 003 "Queues": ``x-qpid-priorities``,
``qpid.queue_sort_key``, ``qpid.last_value_queue_key``, ``qpid.group_header_key``, ...) and
RabbitMQ (``x-max-priority``, ``x-message-ttl``, ``x-dead-letter-exchange``, ...). Where both
exist, both spellings are accepted. Every bad value raises AMQPError 406 PRECONDITION_FAILED
with a text naming the argument, the queue and what was expected. A queue's type is fixed at
declare, and types Qpid cannot combine (priority, sorted, last-value: seed 003 9.1.5) are
refused.
"""
from __future__ import annotations

from enum import IntEnum

from shoal.shared.errors import PRECONDITION_FAILED, AMQPError, soft_error
from shoal.shared.header_table import text as _text
from shoal.shared.selector import ARGUMENT as SELECTOR_ARG
from shoal.shared.selector import Selector, compile_selector


class QueueType(IntEnum):
    """The QueueEntryList variant of a queue (seed 003 9.1)."""

    STANDARD = 0
    PRIORITY = 1
    SORTED = 2
    LAST_VALUE = 3


class Overflow(IntEnum):
    """``x-overflow`` (RabbitMQ): what happens when x-max-length(-bytes) is reached."""

    DROP_HEAD = 0            # the oldest available message is dropped (dead-lettered)
    REJECT_PUBLISH = 1       # the new message is refused (basic.nack to confirming publishers)
    REJECT_PUBLISH_DLX = 2   # refused and dead-lettered


OVERFLOW_NAMES = {"drop-head": Overflow.DROP_HEAD, "reject-publish": Overflow.REJECT_PUBLISH,
                  "reject-publish-dlx": Overflow.REJECT_PUBLISH_DLX}
QPID_POLICY = {"ring": Overflow.DROP_HEAD, "reject": Overflow.REJECT_PUBLISH}

#: The ``x-queue-type`` values accepted: ``classic``, and ``quorum`` until the replication
#: work gives it its meaning (today a classic queue); ``stream`` and anything else are refused
#: with RabbitMQ's 406 for an unsupported type (docs/queues.md, "Queue types").
QUEUE_TYPES = ("classic", "quorum")

DEFAULT_LVQ_KEY = "qpid.LVQ_key"
DEFAULT_GROUP = "qpid.no-group"
QPID_DEFAULT_PRIORITIES = 10


class QueueConfig:
    """The checked features of one queue. ``plain`` is True when none is set but a delivery
    limit (the FIFO fast path). Times in ms, sizes in bytes; None means "not set"."""

    __slots__ = ("type", "max_priority", "priority_offset", "default_priority", "sort_key",
                 "lvq_key",
                 "group_key", "shared_groups", "default_group", "message_ttl", "expires",
                 "max_length", "max_length_bytes", "overflow", "dlx", "dlrk",
                 "max_returns", "consumer_timeout", "single_active", "plain", "needs_props",
                 "max_in_memory_bytes")

    def __init__(self) -> None:
        self.type = QueueType.STANDARD
        self.max_priority = 0          # highest priority level (levels 0..max_priority)
        self.priority_offset = 0       # x-qpid-priorities: level = priority - offset
        self.default_priority = 0      # a message without one: 0 (RabbitMQ), 4 (Qpid, JMS)
        self.sort_key: str | None = None
        self.lvq_key: str | None = None
        self.group_key: str | None = None
        self.shared_groups = False
        self.default_group = DEFAULT_GROUP
        self.message_ttl: int | None = None
        self.expires: int | None = None
        self.max_length: int | None = None
        self.max_length_bytes: int | None = None
        self.overflow = Overflow.DROP_HEAD
        self.dlx: str | None = None
        self.dlrk: str | None = None
        self.max_returns: int | None = None   # dead-letter once returned more often
        self.consumer_timeout: int | None = None
        self.single_active = False
        self.plain = True
        self.needs_props = False       # enqueue must decode properties (type, groups)
        self.max_in_memory_bytes: int | None = None   # paging budget (node/queues/paging.py)


def _bad(arg: str, queue: str, vhost: str, why: str) -> Exception:
    return soft_error(PRECONDITION_FAILED,
                      f"invalid arg '{arg}' for queue '{queue}' in vhost '{vhost}': {why}")



def as_int(args: dict, arg: str, lo: int, hi: int | None, where: tuple[str, str]) -> int | None:
    """``args[arg]`` as an int in [lo, hi], None when absent. Raises 406."""
    if arg not in args:
        return None
    v = _text(args[arg])
    if isinstance(v, str) and v.strip().lstrip("-").isdigit():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v > hi):
        rng = f"an integer >= {lo}" if hi is None else f"an integer from {lo} to {hi}"
        raise _bad(arg, where[0], where[1], f"expected {rng}, got {args[arg]!r}")
    return v


def as_bool(args: dict, arg: str, where: tuple[str, str]) -> bool | None:
    """``args[arg]`` as a bool (true/false, 1/0, "true"/"false"/"1"/"0"); None if absent."""
    if arg not in args:
        return None
    v = _text(args[arg])
    if isinstance(v, bool):
        return v
    if isinstance(v, int) and v in (0, 1):
        return bool(v)
    if isinstance(v, str) and v.lower() in ("true", "false", "1", "0"):
        return v.lower() in ("true", "1")
    raise _bad(arg, where[0], where[1], f"expected a boolean, got {args[arg]!r}")


def as_str(args: dict, arg: str, where: tuple[str, str], empty_ok: bool = False) -> str | None:
    if arg not in args:
        return None
    v = _text(args[arg])
    if not isinstance(v, str) or (not v and not empty_ok):
        raise _bad(arg, where[0], where[1], f"expected a non-empty string, got {args[arg]!r}")
    return v


def parse_queue_arguments(vhost: str, name: str, args: dict | None,
                          restored: bool = False) -> QueueConfig:
    """Check a ``queue.declare`` arguments table. Returns its QueueConfig; raises 406.
    ``restored``: the table of a durable queue read back from the journal, which may predate
    the refusal of ``x-queue-type: stream``: such a queue stays the classic queue it was."""
    cfg = QueueConfig()
    if not args:
        return cfg
    w = (name, vhost)
    kinds = []
    rabbit_prio = as_int(args, "x-max-priority", 1, 255, w)
    qpid_prio = as_int(args, "x-qpid-priorities", 1, 255, w)
    if rabbit_prio is not None and qpid_prio is not None:
        raise _bad("x-qpid-priorities", name, vhost, "give either x-max-priority or "
                                                     "x-qpid-priorities, not both")
    if rabbit_prio is not None:
        cfg.max_priority = rabbit_prio
        kinds.append("priority")
    elif qpid_prio is not None:
        # Qpid maps JMS priorities 0-9 onto n levels around the default 4 (PriorityQueueList)
        cfg.max_priority = qpid_prio - 1
        cfg.priority_offset = 5 - (qpid_prio + 1) // 2
        cfg.default_priority = 4
        kinds.append("priority")
    cfg.sort_key = as_str(args, "qpid.queue_sort_key", w)
    if cfg.sort_key is not None:
        kinds.append("sorted")
    lvq_key = as_str(args, "qpid.last_value_queue_key", w)
    if lvq_key is None and as_bool(args, "qpid.last_value_queue", w):
        lvq_key = DEFAULT_LVQ_KEY
    if lvq_key is not None:
        cfg.lvq_key = lvq_key
        kinds.append("last-value")
    if len(kinds) > 1:
        raise soft_error(PRECONDITION_FAILED,
                         f"queue '{name}' in vhost '{vhost}' cannot be both {kinds[0]} and "
                         f"{kinds[1]}: a queue has one type (Qpid: priority, sorted and "
                         f"last-value queues do not mix)")
    if kinds:
        cfg.type = {"priority": QueueType.PRIORITY, "sorted": QueueType.SORTED,
                    "last-value": QueueType.LAST_VALUE}[kinds[0]]
    qtype = as_str(args, "x-queue-type", w)
    if qtype is not None and qtype not in QUEUE_TYPES and not (restored and qtype == "stream"):
        # RabbitMQ 3.10's words for a type it does not have; streams are one here
        # (docs/queues.md, "Queue types")
        raise _bad("x-queue-type", name, vhost, f'"unsupported queue type \'{qtype}\'"')
    cfg.group_key = as_str(args, "qpid.group_header_key", w)
    shared = as_bool(args, "qpid.shared_msg_group", w)
    cfg.shared_groups = bool(shared)
    default_group = as_str(args, "qpid.default_msg_group", w)
    if default_group is not None:
        cfg.default_group = default_group
    if (shared or default_group is not None) and cfg.group_key is None:
        raise _bad("qpid.shared_msg_group" if shared else "qpid.default_msg_group", name,
                   vhost, "needs qpid.group_header_key")
    cfg.message_ttl = as_int(args, "x-message-ttl", 0, None, w)
    cfg.expires = as_int(args, "x-expires", 1, None, w)
    max_len = as_int(args, "x-max-length", 0, None, w)
    qpid_len = as_int(args, "qpid.max_count", 0, None, w)
    cfg.max_length = max_len if max_len is not None else qpid_len
    max_bytes = as_int(args, "x-max-length-bytes", 0, None, w)
    qpid_bytes = as_int(args, "qpid.max_size", 0, None, w)
    cfg.max_length_bytes = max_bytes if max_bytes is not None else qpid_bytes
    overflow = as_str(args, "x-overflow", w)
    if overflow is not None:
        if overflow not in OVERFLOW_NAMES:
            raise _bad("x-overflow", name, vhost, "expected drop-head, reject-publish or "
                                                  f"reject-publish-dlx, got '{overflow}'")
        cfg.overflow = OVERFLOW_NAMES[overflow]
    policy = as_str(args, "qpid.policy_type", w)
    if policy is not None:
        if policy not in QPID_POLICY:
            raise _bad("qpid.policy_type", name, vhost,
                       f"expected ring or reject, got '{policy}'")
        if overflow is None:
            cfg.overflow = QPID_POLICY[policy]
    cfg.dlx = as_str(args, "x-dead-letter-exchange", w, empty_ok=True)
    cfg.dlrk = as_str(args, "x-dead-letter-routing-key", w, empty_ok=True)
    if cfg.dlrk is not None and cfg.dlx is None:
        raise _bad("x-dead-letter-routing-key", name, vhost, "needs x-dead-letter-exchange")
    # a quorum queue's -1 (any negative) is "no limit" (RabbitMQ 4: resolve_delivery_limit)
    quorum = _text(args.get("x-queue-type")) == "quorum"
    limit = as_int(args, "x-delivery-limit", -(1 << 31) if quorum else 0, None, w)
    qpid_limit = as_int(args, "x-qpid-maximum-delivery-count", 0, None, w)
    if limit is not None and limit >= 0:
        cfg.max_returns = limit                     # RabbitMQ: returns allowed (-1: none)
    elif qpid_limit:
        cfg.max_returns = qpid_limit - 1            # Qpid: deliveries allowed (0 = no limit)
    cfg.consumer_timeout = as_int(args, "x-consumer-timeout", 1, None, w)
    cfg.single_active = bool(as_bool(args, "x-single-active-consumer", w))
    mode = as_str(args, "x-queue-mode", w)
    if mode is not None and mode not in ("default", "lazy"):
        raise _bad("x-queue-mode", name, vhost, f"expected default or lazy, got '{mode}'")
    cfg.max_in_memory_bytes = as_int(args, "x-max-in-memory-bytes", 0, None, w)
    if mode == "lazy" and cfg.max_in_memory_bytes is None:
        cfg.max_in_memory_bytes = 0               # lazy: every body goes to the page files
    cfg.needs_props = cfg.type is not QueueType.STANDARD or cfg.group_key is not None
    # a delivery limit alone keeps the plain path: Queue.release counts it (quorum queues
    # have one by default, RabbitMQ 4's 20)
    cfg.plain = not (cfg.needs_props or cfg.message_ttl is not None or cfg.expires
                     or cfg.max_length is not None or cfg.max_length_bytes is not None
                     or cfg.consumer_timeout or cfg.single_active)
    return cfg


class ConsumerConfig:
    """Checked ``basic.consume`` arguments."""

    __slots__ = ("priority", "selector", "browse", "auto_close", "timeout", "no_local")

    def __init__(self) -> None:
        self.priority = 0
        self.selector: Selector | None = None
        self.browse = False
        self.auto_close = False
        self.timeout: int | None = None
        self.no_local = False


def _bad_consume(arg: str, queue: str, vhost: str, why: str) -> Exception:
    return soft_error(PRECONDITION_FAILED, f"invalid consume arg '{arg}' on queue '{queue}' "
                                           f"in vhost '{vhost}': {why}")


def parse_consume_arguments(vhost: str, queue: str, args: dict | None) -> ConsumerConfig:
    """Check ``basic.consume`` arguments: ``x-priority`` (int), ``x-filter-jms-selector``,
    ``x-filter-no-consume`` / ``x-filter-auto-close`` (bool, Qpid browsers),
    ``x-consumer-timeout`` (ms >= 1), ``x-no-local`` (bool; the router's no_local flag).
    Raises 406."""
    cc = ConsumerConfig()
    if not args:
        return cc
    w = (queue, vhost)
    try:
        prio = as_int(args, "x-priority", -(1 << 31), (1 << 31) - 1, w)
        cc.browse = bool(as_bool(args, "x-filter-no-consume", w))
        cc.auto_close = bool(as_bool(args, "x-filter-auto-close", w))
        cc.timeout = as_int(args, "x-consumer-timeout", 1, None, w)
        cc.no_local = bool(as_bool(args, "x-no-local", w))
    except AMQPError as err:  # re-word as a consume error
        raise soft_error(PRECONDITION_FAILED,
                         err.text.replace("invalid arg", "invalid consume arg")) from None
    cc.priority = prio or 0
    if SELECTOR_ARG in args:
        v = _text(args[SELECTOR_ARG])
        if not isinstance(v, str):
            raise _bad_consume(SELECTOR_ARG, queue, vhost, "expected a string")
        cc.selector = compile_selector(v)
    return cc
