"""A replicated stream under a fault (docs/streams.md, "Replication"): 3 nodes, a stream of
3 members, a publisher with confirms and two consumers reading from ``first`` while the
leader's node is killed (kill -9, restarted by the launcher) or stopped (SIGSTOP for 4 s: its
links stay open, the others elect a leader by their timeouts), or while a member that does
not lead is killed: the two consumers read from the two members that do not lead (router
/quorum.py ``read_node``), so one of them reads there.

What a user sees, as with RabbitMQ's streams: the consumers stay subscribed (no
basic.cancel); one whose member is lost goes on at the next offset from another; no offset is
delivered twice or with two messages; every confirmed message is in the stream. A publish whose
confirm was lost with the node is sent again to the new leader by the router (at least
once): with pika's one publish in flight, at most one message can be stored twice.
"""
from __future__ import annotations

import re
import signal
import threading
import time

import pika
import pytest

from tests.conftest import EMBED
from tests.e2e.durability.test_durability import (AFTER_FAULT, PERSISTENT, kill9, params,
                                                   pids, read_stream, session)

pytestmark = pytest.mark.e2e


def stream_leader(cl, stream: str) -> tuple[str, int]:
    """The node that leads ``stream`` last (its log line "... node-N leads (term T)")."""
    pat = re.compile(rf"stream '{re.escape(stream)}' in vhost '/': (node-\d+) leads "
                     rf"\(term (\d+)\)")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = [(n, int(t)) for n, t in pat.findall(cl.log_path.read_text(errors="replace"))]
        if found:
            return max(found, key=lambda f: f[1])
        time.sleep(0.05)
    raise AssertionError(f"no leader for {stream}\n{cl.log_tail()}")


@pytest.mark.skipif(EMBED, reason="--embed-node: node-0 has no links to the other nodes, so "
                                  "the stream has two members, and one stopped leaves no majority")
@pytest.mark.parametrize("own_cluster", [3], indirect=True)
@pytest.mark.parametrize("fault", ["kill", "stop", "kill_reader"])
def test_a_replicated_stream_keeps_its_consumers_and_every_confirmed_message_through_a_fault(
        own_cluster, fault):
    cl = own_cluster
    stream = cl.queue_on("node-1", "stream")
    s = session(cl)
    s.ch.queue_declare(stream, durable=True, arguments={"x-queue-type": "stream",
                                                        "x-initial-cluster-size": 3})
    gots: list[list[tuple[int, bytes]]] = [[], []]
    cancelled: list[str] = []
    stop = threading.Event()

    def consume(got: list) -> None:
        conn = pika.BlockingConnection(params(cl))
        ch = conn.channel()
        ch.basic_qos(prefetch_count=100)

        def on_message(ch, method, props, body):
            got.append((props.headers["x-stream-offset"], body))
            ch.basic_ack(method.delivery_tag)
        ch.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
        ch.basic_consume(stream, on_message, arguments={"x-stream-offset": "first"})
        while not stop.is_set():
            conn.process_data_events(time_limit=0.1)
        conn.close()

    readers = [threading.Thread(target=consume, args=(got,), daemon=True) for got in gots]
    for reader in readers:
        reader.start()
    confirmed: list[bytes] = []
    for i in range(200):
        s.ch.basic_publish("", stream, b"m%d" % i, PERSISTENT)
        confirmed.append(b"m%d" % i)
    leader, term = stream_leader(cl, stream)
    if fault == "kill_reader":          # a member that does not lead: one reader reads there
        leader = next(n for n in ("node-0", "node-1", "node-2") if n != leader)
    victim = pids(cl)[leader]
    if fault in ("kill", "kill_reader"):
        faulter = threading.Thread(target=kill9, args=(cl, leader))
    else:
        def pause() -> None:
            cl.kill_node(leader, signal.SIGSTOP)
            time.sleep(4)
            cl.kill_node(leader, signal.SIGCONT)
        faulter = threading.Thread(target=pause)
    faulter.start()
    deadline = time.monotonic() + 60
    i, after = 200, 0
    while i < 2000 and after < AFTER_FAULT and time.monotonic() < deadline:
        try:
            s.ch.basic_publish("", stream, b"m%d" % i, PERSISTENT)
            confirmed.append(b"m%d" % i)
        except (pika.exceptions.AMQPError, OSError):
            s.close()
            s = session(cl)
        i += 1
        if not faulter.is_alive():      # the victim restarted, or the pause is over
            after += 1
    faulter.join()
    if fault != "stop":
        assert pids(cl)[leader] != victim
    else:                               # another member led while it was stopped
        assert stream_leader(cl, stream)[1] > term
    s.close()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and \
            not all(set(confirmed) <= {b for _, b in got} for got in gots):
        time.sleep(0.2)
    stop.set()
    for reader in readers:
        reader.join(10)
    assert not cancelled, "a consumer was cancelled by the fault"
    again = read_stream(cl, stream)     # a new reader from first: every offset once, 0, 1, ...
    assert [o for o, _ in again] == list(range(len(again)))
    for got in gots:
        offsets = [o for o, _ in got]
        assert offsets == sorted(set(offsets)), "an offset delivered twice or out of order"
        bodies = [b for _, b in got]
        assert set(confirmed) <= set(bodies), sorted(set(confirmed) - set(bodies))[:5]
        assert len(bodies) - len(set(bodies)) <= 1
        first_seen = list(dict.fromkeys(bodies))
        assert [b for b in first_seen if b in set(confirmed)] == confirmed
        assert dict(again).items() >= dict(got).items()   # the same message at each offset
