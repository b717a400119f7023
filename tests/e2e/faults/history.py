"""The fault campaign's history and its checker (tests/e2e/faults/campaign.py).

:class:`History` records, from every client thread, each publish (publisher, seq, queue, when it
was sent and when its outcome came: confirmed, nacked, returned or unknown) and each delivery
(queue, publisher, seq, redelivered, its place in the queue's one consumer stream), and, from
the fault loop, each round, fault and wipe. :func:`check` reads the whole history afterwards:

1. every confirmed message is delivered at least once, except on a classic queue whose node's
   data directory was wiped after it was sent (quorum queues and streams are never exempt);
2. nothing is delivered that was never published, or to another queue than it was sent to;
3. every delivery of a message after its first carries ``redelivered`` (on a queue; on a
   stream a message is read again only when it was stored twice, at another offset: a
   publish the router sent again to a new leader, counted);
4. order: for each queue and publisher, when A was confirmed before B was published, A's
   first delivery comes before B's in the queue's consumer stream (unless A's first delivery
   seen is flagged redelivered: the broker's first went to a consumer that lost it, and a
   redelivery is not held to the order; these are counted);
5. a stream's offsets: its consumer (which subscribes again after a failure at the offset
   after its last delivery) gets them in increasing order, never one twice, and no offset
   ever holds two different messages.

Each violation names the rule, the message ids, the rounds and the faults in force; the
figures (:meth:`Verdict.lines`) are what the run reports.
"""
from __future__ import annotations

import bisect
import collections
import json
import threading
import time
from dataclasses import dataclass, field

OUTCOMES = ("confirmed", "nacked", "returned", "unknown")


@dataclass
class Publish:
    """One basic.publish: sent at ``t0``, outcome known at ``t1``."""

    pub: str
    seq: int
    queue: str
    t0: float
    round: int
    t1: float | None = None
    outcome: str = "pending"    #: confirmed, nacked, returned (unroutable), unknown

    @property
    def id(self) -> str:
        return f"{self.pub}-{self.seq}"


@dataclass
class Delivery:
    """One message the consumers of ``queue`` got; ``pos`` is its place in that stream."""

    queue: str
    pub: str
    seq: int
    redelivered: bool
    t: float
    pos: int
    round: int
    offset: int | None = None   #: a stream's x-stream-offset

    @property
    def id(self) -> str:
        return f"{self.pub}-{self.seq}"


@dataclass
class Fault:
    """One fault of a round: ``kind`` (kill, pause, wipe, cut, oneway) of ``target``."""

    round: int
    kind: str
    target: str
    hold: float
    t0: float | None = None     #: applied (None: not yet)
    t1: float | None = None     #: healed

    def text(self) -> str:
        return f"{self.kind} {self.target} ({self.hold:.1f} s)"


@dataclass
class Round:
    """One round: from the start of its calm (``t0``) to its recovery."""

    index: int
    t0: float
    faults: list[Fault] = field(default_factory=list)
    t_healed: float | None = None
    recovered_s: float | None = None


class History:
    """Everything the campaign saw; appended to by many threads (one lock)."""

    def __init__(self, queue_types: dict[str, str]) -> None:
        self.queue_types = dict(queue_types)  #: queue -> "classic" | "quorum" | "stream"
        self.lock = threading.Lock()
        self.publishes: list[Publish] = []
        self.deliveries: dict[str, list[Delivery]] = {q: [] for q in queue_types}
        self.rounds: list[Round] = []
        self.wipes: list[tuple[str, float, int]] = []   #: (classic queue, restart time, round)
        self.notes: list[str] = []                  #: liveness findings, unexpected exits
        self.round = 0                              #: 0 before the first round
        self.t_start = time.monotonic()
        self.wall_start = time.time()               #: to match the processes' log lines
        self.t_stop_publishing: float | None = None

    def publish(self, pub: str, seq: int, queue: str) -> Publish:
        p = Publish(pub, seq, queue, time.monotonic(), self.round)
        with self.lock:
            self.publishes.append(p)
        return p

    def outcome(self, p: Publish, outcome: str) -> None:
        p.t1, p.outcome = time.monotonic(), outcome

    def deliver(self, queue: str, pub: str, seq: int, redelivered: bool,
                offset: int | None = None) -> None:
        with self.lock:
            stream = self.deliveries[queue]
            stream.append(Delivery(queue, pub, seq, redelivered, time.monotonic(), len(stream),
                                   self.round, offset))

    def note(self, text: str) -> None:
        with self.lock:
            self.notes.append(f"round {self.round}: {text}")

    def dump(self, path) -> None:
        """Write the history as JSON lines (times relative to the start), for a post-mortem."""
        rel = self.t_start
        with open(path, "w") as f:
            f.write(json.dumps({"wall_start": self.wall_start,
                                "queue_types": self.queue_types}) + "\n")
            for r in self.rounds:
                f.write(json.dumps({"round": r.index, "t0": r.t0 - rel, "faults": [
                    {"kind": x.kind, "target": x.target,
                     "t0": None if x.t0 is None else x.t0 - rel,
                     "t1": None if x.t1 is None else x.t1 - rel} for x in r.faults],
                    "recovered_s": r.recovered_s}) + "\n")
            for q, t, i in self.wipes:
                f.write(json.dumps({"wipe": q, "t": t - rel, "round": i}) + "\n")
            for p in self.publishes:
                f.write(json.dumps({"pub": p.id, "queue": p.queue, "t0": p.t0 - rel,
                                    "t1": None if p.t1 is None else p.t1 - rel,
                                    "outcome": p.outcome, "round": p.round}) + "\n")
            for q, stream in self.deliveries.items():
                for d in stream:
                    f.write(json.dumps({"got": d.id, "queue": q, "pos": d.pos, "t": d.t - rel,
                                        "redelivered": d.redelivered, "round": d.round}) + "\n")

    def clock(self, t: float) -> str:
        """Monotonic ``t`` as the wall clock time of the processes' logs (HH:MM:SS.mmm)."""
        wall = self.wall_start + (t - self.t_start)
        return time.strftime("%H:%M:%S", time.localtime(wall)) + f".{int(wall % 1 * 1000):03d}"

    def context(self, t: float) -> str:
        """The round at time ``t``, the faults in force then, and the wall clock time."""
        rnd = None
        for r in self.rounds:
            if r.t0 <= t:
                rnd = r
        if rnd is None:
            return f"before round 1, {self.clock(t)}"
        active = [f.text() for f in rnd.faults
                  if f.t0 is not None and f.t0 <= t and (f.t1 is None or t <= f.t1)]
        where = "in force: " + ", ".join(active) if active else (
            "no fault in force; round's faults: " + ", ".join(f.text() for f in rnd.faults))
        return f"round {rnd.index} at {self.clock(t)} ({where})"


@dataclass
class Violation:
    rule: int
    text: str


@dataclass
class Verdict:
    """The checker's answer: the violations (none: the history is correct) and the figures."""

    violations: list[Violation]
    figures: dict

    @property
    def ok(self) -> bool:
        return not self.violations

    def lines(self) -> list[str]:
        f = self.figures
        out = [f"rounds {f['rounds']}, faults {f['faults']} by kind {f['faults_by_kind']}",
               f"published {f['published']}: confirmed {f['confirmed']}, nacked {f['nacked']}, "
               f"returned {f['returned']}, unknown {f['unknown']}",
               f"delivered {f['delivered']} ({f['distinct_delivered']} distinct), duplicates "
               f"{f['duplicates']} (flagged redelivered: {f['duplicates_flagged']}; stored "
               f"twice in a stream: {f['stream_stored_twice']}), lost {f['lost']}, exempt "
               f"(wiped classic queue) {f['exempt']}",
               "longest time with no confirm: " + ", ".join(
                   f"{k} {v['seconds']:.1f} s ({v['queue']}, {v['where']})"
                   for k, v in f["longest_no_confirm"].items()),
               f"violations {sum(f['violations_by_rule'].values())} by rule "
               f"{f['violations_by_rule']} (redelivered after later messages, allowed: "
               f"{f['order_after_lost_delivery']}), notes "
               f"{f['notes']}, wall time {f['wall_s']:.0f} s"]
        return out


def check(h: History, limit: int = 50) -> Verdict:
    """Check the four rules over ``h`` (see the module docstring); report at most ``limit``
    violations per rule (the figures count them all)."""
    pubs = {p.id: p for p in h.publishes}
    firsts: dict[str, Delivery] = {}
    counts: collections.Counter[str] = collections.Counter()
    found: dict[int, list[Violation]] = collections.defaultdict(list)
    dup_total = dup_flagged = stream_twice = 0

    def add(rule: int, text: str) -> None:
        found[rule].append(Violation(rule, text))

    for q, stream in h.deliveries.items():
        for d in stream:
            p = pubs.get(d.id)
            if p is None:
                add(2, f"{d.id} delivered from {q} (position {d.pos}, {h.context(d.t)}) "
                       f"but never published")
                continue
            if p.queue != q:
                add(2, f"{d.id} published to {p.queue} but delivered from {q} "
                       f"({h.context(d.t)})")
            counts[d.id] += 1
            if d.id not in firsts:
                firsts[d.id] = d
                continue
            dup_total += 1
            dup_flagged += d.redelivered
            if h.queue_types.get(q) == "stream" and d.offset != firsts[d.id].offset:
                stream_twice += 1           # stored twice (rule 3's note): at two offsets
            elif not d.redelivered:
                first = firsts[d.id]
                add(3, f"{d.id} on {q}: delivery {counts[d.id]} (position {d.pos}, "
                       f"{h.context(d.t)}) without redelivered; first at position {first.pos} "
                       f"({h.context(first.t)}); published {h.context(p.t0)}, {p.outcome}")

    wiped = collections.defaultdict(float)
    for q, t, _ in h.wipes:
        wiped[q] = max(wiped[q], t)
    lost = exempt = 0
    for p in h.publishes:
        if p.outcome != "confirmed" or p.id in counts:
            continue
        if h.queue_types.get(p.queue) == "classic" and p.t0 <= wiped.get(p.queue, -1.0):
            exempt += 1
            continue
        lost += 1
        add(1, f"{p.id} to {p.queue} ({h.queue_types.get(p.queue)}) confirmed, never "
               f"delivered; published {h.context(p.t0)}, confirmed {h.context(p.t1)}")

    redelivered_late = _check_order(h, firsts, add)
    _check_offsets(h, add)
    by_kind = collections.Counter(f"{f.kind} {_target_class(f.target)}"
                                  for r in h.rounds for f in r.faults)
    outcomes = collections.Counter(p.outcome for p in h.publishes)
    figures = {
        "rounds": len(h.rounds), "faults": sum(by_kind.values()),
        "faults_by_kind": dict(sorted(by_kind.items())),
        "published": len(h.publishes), **{o: outcomes.get(o, 0) for o in OUTCOMES},
        "pending": outcomes.get("pending", 0),
        "delivered": sum(len(s) for s in h.deliveries.values()),
        "distinct_delivered": len(counts), "duplicates": dup_total,
        "duplicates_flagged": dup_flagged, "stream_stored_twice": stream_twice,
        "lost": lost, "exempt": exempt,
        "longest_no_confirm": _longest_no_confirm(h),
        "violations_by_rule": {r: len(v) for r, v in sorted(found.items())},
        "order_after_lost_delivery": redelivered_late,
        "notes": len(h.notes), "wall_s": time.monotonic() - h.t_start,
    }
    violations = [v for r in sorted(found) for v in found[r][:limit]]
    return Verdict(violations, figures)


def _check_order(h: History, firsts: dict[str, Delivery], add) -> int:
    """Rule 4, per (queue, publisher): each confirmed message A against the earliest first
    delivery among the messages published after A's confirm (a suffix minimum over the
    publishes in send order). One violation per A, naming the messages that overtook it.

    An A whose first delivery seen carries ``redelivered`` is not held to it: the broker had
    delivered it before, to a consumer whose connection was lost before it got there, and a
    redelivery may come after later messages (AMQP 0-9-1 spec 4.7 orders deliveries, not
    redeliveries; RabbitMQ's "Message ordering guarantees" likewise). Those are counted
    (returned), not violations; a message that overtakes A is held to it either way."""
    allowed = 0
    groups: dict[tuple[str, str], list[Publish]] = collections.defaultdict(list)
    for p in h.publishes:
        if p.id in firsts:
            groups[(p.queue, p.pub)].append(p)
    for (q, pub), ps in sorted(groups.items()):
        ps.sort(key=lambda p: p.t0)
        starts = [p.t0 for p in ps]
        suffix: list[tuple[int, int]] = [(1 << 62, -1)] * (len(ps) + 1)  # (min pos, index)
        for i in range(len(ps) - 1, -1, -1):
            suffix[i] = min(suffix[i + 1], (firsts[ps[i].id].pos, i))
        for a in ps:
            if a.outcome != "confirmed" or a.t1 is None:
                continue
            fa = firsts[a.id]
            j = bisect.bisect_right(starts, a.t1)
            if suffix[j][0] >= fa.pos:
                continue
            if fa.redelivered:
                allowed += 1
                continue
            overtook = [b for b in ps[j:] if firsts[b.id].pos < fa.pos]
            fb = firsts[overtook[0].id]
            how = "its first delivery without redelivered"
            add(4, f"{q}, {pub}: {a.id} confirmed ({h.context(a.t1)}) but first delivered at "
                   f"position {fa.pos} ({h.context(fa.t)}), after {len(overtook)} message(s) "
                   f"published after its confirm, e.g. {overtook[0].id} at position {fb.pos} "
                   f"({h.context(fb.t)}): {', '.join(b.id for b in overtook[:6])}; {how}")
    return allowed


def _check_offsets(h: History, add) -> None:
    """Rule 5, per stream: the offsets its consumer got increase, and an offset never holds
    two messages."""
    for q, stream in sorted(h.deliveries.items()):
        if h.queue_types.get(q) != "stream":
            continue
        held: dict[int, str] = {}
        last = None
        for d in stream:
            if d.offset is None:
                add(5, f"{d.id} delivered from stream {q} without x-stream-offset")
                continue
            if held.setdefault(d.offset, d.id) != d.id:
                add(5, f"{q}: offset {d.offset} delivered as {held[d.offset]} and as {d.id} "
                       f"({h.context(d.t)})")
            if last is not None and d.offset <= last.offset:
                add(5, f"{q}: offset {d.offset} ({d.id}, {h.context(d.t)}) delivered after "
                       f"offset {last.offset} ({last.id}, {h.context(last.t)})")
            last = d


def _longest_no_confirm(h: History) -> dict[str, dict]:
    """Per queue type, the longest time one of its queues went without a confirm while the
    publishers ran (until the last publish, or the end of publishing)."""
    times: dict[str, list[float]] = collections.defaultdict(list)
    for p in h.publishes:
        if p.outcome == "confirmed" and p.t1 is not None:
            times[p.queue].append(p.t1)
    end = h.t_stop_publishing or max((p.t0 for p in h.publishes), default=h.t_start)
    out: dict[str, dict] = {}
    for q, kind in sorted(h.queue_types.items()):
        ts = sorted(times[q]) + [end]
        gap, at = max(((b - a, a) for a, b in zip(ts, ts[1:])), default=(0.0, None))
        if kind not in out or gap > out[kind]["seconds"]:
            out[kind] = {"seconds": gap, "queue": q, "where": "-" if at is None else
                         f"from {h.context(at)} to {h.context(at + gap)}"}
    return out


def _target_class(target: str) -> str:
    """``node-1`` -> node, ``router-0<->node-2`` -> router-node, ``clients->router-1`` ->
    clients-router."""
    parts = [t.split("-")[0] for t in target.replace("<->", " ").replace("->", " ").split()]
    return "-".join(parts)
