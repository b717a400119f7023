"""What a RabbitMQ 3.10 client sees when a cluster member fails, on RabbitMQ or on Shoal
(issue 36, part 4).

    python3 tests/benchmarks/failure_table.py --broker rabbitmq|shoal [--repeat N]
                                              [--only classic-kill,...] [--work DIR]

Every round starts a fresh 3-node cluster (_quorum_clusters.py: RabbitMQ rabbit1..3@localhost
on AMQP ports 5681-5683; Shoal ``shoal serve`` with 3 nodes and 1 router) and stops it
whatever happens. A scenario uses one new durable queue whose home (classic) or leader
(quorum) is the *victim*, and pika clients on a node that is not the victim (RabbitMQ: queue
declared through rabbit3, which the client-local locators make its home/leader, clients on
rabbit1; Shoal: clients on the router, a name that placement puts on node-2, a quorum queue's
leader read from the log). Faults:

- ``kill``: SIGKILL of the victim (RabbitMQ: its beam.smp), kept down 15 s, then restarted on
  its data (Shoal's launcher, which restarts a node within 0.5 s, is held with SIGSTOP).
- ``stop``: SIGSTOP of the victim for 15 s, then SIGCONT.
- ``hang`` (classic only; last, as it can leave RabbitMQ partitioned): SIGSTOP until the
  client's node notices (at most 120 s), the probes, then SIGCONT.

Recorded (times from the fault): probes 3 s into the fault (``hang``: once noticed) and
again at the victim's return, all at once, each on its own connection and thread, bounded
(40 s; 30 s for the publish): ``queue.declare`` (same arguments, durable), ``basic.consume``,
``basic.get``, one persistent confirmed publish to the default exchange (mandatory false),
each answered by reply code and text, ok, ack/nack, or "no answer within N s"; what an
existing consumer (prefetch 100, manual acks) is sent; a steady confirmed publisher
(SelectConnection, 500 msg/s, at most 1,000 unconfirmed): the longest gap between acks from
the last one before the fault on, its nacks and closes; when the client's node noticed the
victim down (RabbitMQ: ``nodedown`` from ``erlang:monitor_node`` evaluated on rabbit1 with
``rabbitmqctl eval``; Shoal: the timestamp of the router's ``node node-N disconnected|silent
for`` log line); seconds from the return (SIGCONT or restart command) until a declare, a
consume and a confirmed publish all succeed; acked messages that neither the consumer, a get
nor the final drain received (lost), by when they were acked.

Prints a markdown table (one row per scenario and round); WORK/results.json has it all.
"""
from __future__ import annotations

import argparse
import itertools
import json
import signal
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pika
import pika.exceptions as px

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _quorum_clusters import QUORUM, RabbitCluster, ShoalCluster  # noqa: E402
from compare_rabbitmq import log  # noqa: E402

RATE, WINDOW = 500, 1000
PROBE_S, PUBLISH_S, PROBE_AT_S, DOWN_S, PRE_S = 40.0, 30.0, 3.0, 15.0, 3.0
WORKS_CAP_S, HANG_CAP_S = 90.0, 120.0
PERSISTENT = pika.BasicProperties(delivery_mode=2)
SCENARIOS = [("classic", "kill"), ("quorum", "kill"), ("classic", "stop"),
             ("quorum", "stop"), ("classic", "hang")]


# -- client helpers -----------------------------------------------------------------------
def params(url: str) -> pika.URLParameters:
    p = pika.URLParameters(url)
    p.socket_timeout, p.blocked_connection_timeout, p.connection_attempts = 10, PROBE_S, 1
    return p


def reply(exc: BaseException) -> str:
    """A failure as the broker said it (code and text) or as pika raised it."""
    if isinstance(exc, (px.ChannelClosedByBroker, px.ConnectionClosedByBroker)):
        what = "channel" if isinstance(exc, px.ChannelClosedByBroker) else "connection"
        return f"{what} closed {exc.reply_code} {exc.reply_text}"
    return "nack" if isinstance(exc, px.NackError) else f"{type(exc).__name__}: {exc}"[:200]


def spawn(fn) -> tuple[threading.Thread, dict]:
    """Run ``fn`` in a daemon thread; its box gets the answer (or failure) and duration."""
    box: dict = {}

    def run() -> None:
        t = time.monotonic()
        try:
            box["answer"] = fn()
        except Exception as exc:  # noqa: BLE001 - the answer is the failure
            box["answer"] = reply(exc)
        box["s"] = round(time.monotonic() - t, 2)
    th = threading.Thread(target=run, daemon=True)
    th.start()
    return th, box


def settle(th: threading.Thread, box: dict, deadline: float, limit: float) -> dict:
    th.join(max(0.0, deadline - time.monotonic()))
    return box if "answer" in box else {"answer": f"no answer within {limit:.0f} s"}


class Ledger:
    """Sequence numbers acked by the broker (with when) and received by any client."""

    def __init__(self) -> None:
        self.acked: dict[int, float] = {}
        self.received: set[int] = set()
        self.probe_seqs = itertools.count(10 ** 9)

    def ack(self, seq: int) -> None:
        self.acked[seq] = time.monotonic()

    def got(self, payload: bytes) -> None:
        self.received.add(int(payload))


# -- probes -------------------------------------------------------------------------------
def probe_ops(url: str, queue: str, args: dict, ledger: Ledger) -> dict:
    """The four client calls, each on its own connection: name -> (callable, time limit)."""
    def with_channel(op):
        def run():
            conn = pika.BlockingConnection(params(url))
            answer = op(conn.channel())
            conn.close()            # a consume's unacked deliveries go back to the queue
            return answer
        return run

    def declare(ch):
        ch.queue_declare(queue, durable=True, arguments=args)
        return "ok"

    def consume(ch):
        ch.basic_qos(prefetch_count=1)
        ch.basic_consume(queue, lambda *a: None)
        return "ok"

    def get(ch):
        method, _props, payload = ch.basic_get(queue)
        if method is None:
            return "ok (empty)"
        ledger.got(payload)
        ch.basic_ack(method.delivery_tag)
        return "ok (a message)"

    def publish(ch):
        ch.confirm_delivery()
        seq = next(ledger.probe_seqs)
        ch.basic_publish("", queue, str(seq).encode(), PERSISTENT)   # a nack raises
        ledger.ack(seq)
        return "ack"
    return {name: (with_channel(op), PUBLISH_S if op is publish else PROBE_S) for name, op
            in (("declare", declare), ("consume", consume), ("get", get), ("publish", publish))}


def run_probes(url: str, queue: str, args: dict, ledger: Ledger, cap: float = PROBE_S
               ) -> dict:
    """All four probes at once, each bounded by its limit (at most ``cap``)."""
    started = {name: (spawn(fn), min(limit, cap))
               for name, (fn, limit) in probe_ops(url, queue, args, ledger).items()}
    t0 = time.monotonic()
    return {name: settle(th, box, t0 + limit, limit)
            for name, ((th, box), limit) in started.items()}


def until_works(url: str, queue: str, args: dict, ledger: Ledger, since: float) -> dict:
    """Seconds from ``since`` until the four probes all succeed (each try bounded by 10 s),
    and the first failure seen meanwhile."""
    first = None
    while time.monotonic() - since < WORKS_CAP_S:
        answers = run_probes(url, queue, args, ledger, cap=10)
        failed = [f"{name}: {box['answer']}" for name, box in answers.items()
                  if not box["answer"].startswith(("ok", "ack"))]
        if not failed:
            return {"s": round(time.monotonic() - since, 2), "first_failure": first}
        first = first or failed[0]
        time.sleep(0.5)
    return {"s": None, "first_failure": first}


# -- long-lived clients -------------------------------------------------------------------
class Consumer(threading.Thread):
    """The existing consumer: prefetch 100, manual acks; records what the broker does to it."""

    def __init__(self, url: str, queue: str, ledger: Ledger) -> None:
        super().__init__(daemon=True)
        self.url, self.queue, self.ledger = url, queue, ledger
        self.events: list[tuple[float, str]] = []
        self.deliveries: list[float] = []
        self.ready, self.stopping = threading.Event(), False

    def run(self) -> None:
        try:
            conn = pika.BlockingConnection(params(self.url))
            ch = conn.channel()
            ch.basic_qos(prefetch_count=100)
            ch.add_on_cancel_callback(
                lambda _f: self.events.append((time.monotonic(), "basic.cancel")))
            ch.basic_consume(self.queue, self.on_message)
            self.ready.set()
            while not self.stopping:
                conn.process_data_events(time_limit=0.2)
            conn.close()
        except Exception as exc:  # noqa: BLE001 - what the client saw
            self.events.append((time.monotonic(), reply(exc)))
        finally:
            self.ready.set()

    def on_message(self, ch, method, _props, payload) -> None:
        self.ledger.got(payload)
        self.deliveries.append(time.monotonic())
        ch.basic_ack(method.delivery_tag)


class Publisher(threading.Thread):
    """The steady confirmed publisher: ``RATE`` persistent msg/s (token bucket), at most
    ``WINDOW`` unconfirmed; a closed channel or connection is recorded and reopened."""

    def __init__(self, url: str, queue: str, ledger: Ledger) -> None:
        super().__init__(daemon=True)
        self.url, self.queue, self.ledger = url, queue, ledger
        self.acks: list[float] = []
        self.nacks: list[float] = []
        self.events: list[tuple[float, str]] = []
        self.pending: dict[int, int] = {}          # delivery tag -> seq
        self.seq = self.unanswered = 0
        self.paused = self.stopping = False
        self.conn = None

    def run(self) -> None:
        while not self.stopping:
            self.conn = pika.SelectConnection(
                params(self.url), on_open_callback=lambda c: c.channel(
                    on_open_callback=self.on_channel),
                on_open_error_callback=self.on_closed, on_close_callback=self.on_closed)
            self.conn.add_on_connection_blocked_callback(
                lambda *_a: self.events.append((time.monotonic(), "connection.blocked")))
            self.conn.ioloop.start()
            time.sleep(0 if self.stopping else 0.5)

    def on_closed(self, conn, reason) -> None:
        if not self.stopping:
            self.events.append((time.monotonic(), f"connection: {reply(reason)}"))
        self.forget()
        conn.ioloop.stop()

    def forget(self) -> None:
        self.unanswered += len(self.pending)
        self.pending.clear()

    def on_channel(self, ch) -> None:
        self.ch, self.tag, self.credit, self.last = ch, 0, 0.0, time.monotonic()
        ch.add_on_close_callback(self.on_channel_closed)
        ch.confirm_delivery(self.on_confirm, callback=lambda _f: self.tick())

    def on_channel_closed(self, _ch, reason) -> None:
        self.forget()
        if not self.stopping:
            self.events.append((time.monotonic(), f"channel: {reply(reason)}"))
            self.conn.close()

    def tick(self) -> None:
        if self.stopping or not self.ch.is_open:
            return
        now = time.monotonic()
        self.credit = min(self.credit + (now - self.last) * RATE, 50.0)
        self.last = now
        n = 0 if self.paused else max(0, int(min(self.credit, WINDOW - len(self.pending))))
        for _ in range(n):
            self.tag += 1
            self.pending[self.tag] = self.seq
            self.ch.basic_publish("", self.queue, str(self.seq).encode(), PERSISTENT)
            self.seq += 1
        self.credit -= n
        self.conn.ioloop.call_later(0.01, self.tick)

    def on_confirm(self, frame) -> None:
        m, now = frame.method, time.monotonic()
        tags = [t for t in self.pending if t <= m.delivery_tag] if m.multiple \
            else [m.delivery_tag]
        for seq in filter(lambda s: s is not None, (self.pending.pop(t, None) for t in tags)):
            if isinstance(m, pika.spec.Basic.Ack):
                self.ledger.ack(seq)
                self.acks.append(now)
            else:
                self.nacks.append(now)

    def finish(self, wait_s: float = 5.0) -> None:
        """Stop publishing, wait up to ``wait_s`` for outstanding confirms, close."""
        self.paused = True
        deadline = time.monotonic() + wait_s
        while self.pending and time.monotonic() < deadline:
            time.sleep(0.1)
        self.stopping = True
        if self.conn is not None:
            self.conn.ioloop.add_callback_threadsafe(
                lambda: self.conn.close() if self.conn.is_open else self.conn.ioloop.stop())
        self.join(10)
        self.forget()

    def longest_gap(self, fault_at: float, end: float) -> float:
        """Longest gap between acks, from the last one before ``fault_at`` to ``end``."""
        times = [t for t in self.acks if t <= fault_at][-1:] + \
            [t for t in self.acks if t > fault_at] + [end]
        return round(max((b - a for a, b in zip(times, times[1:])), default=end - fault_at), 2)


def drain(urls: list, queue: str, ledger: Ledger) -> str:
    """Consume what is left through the first of ``urls`` that can (RabbitMQ: the client's
    node, else the victim's own port, e.g. when a partition remains) until nothing came for
    3 s (at most 60 s)."""
    failures: list[str] = []
    for url in filter(None, urls):
        c = Consumer(url, queue, ledger)
        c.start()
        c.ready.wait(15)
        t0 = time.monotonic()
        while c.is_alive() and time.monotonic() - max([t0, *c.deliveries[-1:]]) < 3 \
                and time.monotonic() - t0 < 60:
            time.sleep(0.2)
        c.stopping = True
        c.join(5)
        if not c.events:
            return f"{len(c.deliveries)} through port {url.split(':')[-1][:-1]}"
        failures += [what for _, what in c.events]
    return "failed: " + "; ".join(failures)


# -- scenarios ----------------------------------------------------------------------------
def wait_noticed(poll, timeout: float) -> float | None:
    """Poll a ``watch_down`` watcher for up to ``timeout`` s: its wall time or None."""
    deadline = time.monotonic() + timeout
    while True:
        done, at = poll()
        if done or time.monotonic() > deadline:
            return at
        time.sleep(0.1)


def inject(cluster, fault: str, victim: str, poll, probes, res: dict) -> tuple[float, float]:
    """Apply ``fault``, run ``probes()`` while the victim is down or hung (into
    ``res['during']``), bring the victim back: (when it was brought back, when it was up)."""
    t0 = time.monotonic()
    if fault == "kill":
        cluster.kill_node(victim)
        time.sleep(PROBE_AT_S)
        res["during"] = probes()
    else:
        cluster.signal_node(victim, signal.SIGSTOP)
        if fault == "hang":
            wait_noticed(poll, HANG_CAP_S)
        else:
            time.sleep(PROBE_AT_S)
        th, box = spawn(probes)
        th.join(0 if fault == "stop" else None)
    time.sleep(max(0.0, t0 + (0 if fault == "hang" else DOWN_S) - time.monotonic()))
    res["down_s"] = round(time.monotonic() - t0, 1)
    back = time.monotonic()
    if fault == "kill":
        cluster.restart_node(victim)
        res["boot_s"] = round(time.monotonic() - back, 1)
        return back, time.monotonic()
    cluster.signal_node(victim, signal.SIGCONT)
    th.join(PROBE_S + 5)
    res["during"] = box.get("answer") or "the probes did not finish"
    return back, back


def scenario(cluster, kind: str, fault: str) -> dict:
    args = QUORUM if kind == "quorum" else {}
    queue, victim = cluster.place_on_victim(f"ft-{kind}-{uuid.uuid4().hex[:8]}-{{}}", args)
    url, ledger = cluster.url, Ledger()
    res: dict = {"queue_type": kind, "fault": fault, "queue": queue, "victim": victim}
    log(f"{cluster.label} {kind}/{fault}: {queue} on {victim}, clients on {url}")
    poll, close_watch = cluster.watch_down(victim)
    consumer, pub = Consumer(url, queue, ledger), Publisher(url, queue, ledger)
    consumer.start()
    consumer.ready.wait(15)
    pub.start()
    time.sleep(PRE_S)
    t0, wall0 = time.monotonic(), time.time()
    try:
        back, up = inject(cluster, fault, victim, poll,
                          lambda: run_probes(url, queue, args, ledger), res)
    finally:
        cluster.signal_node(victim, signal.SIGCONT)    # whatever happened: never left hung
    after_th, after_box = spawn(lambda: run_probes(url, queue, args, ledger))
    res["works_again"] = until_works(url, queue, args, ledger, back)
    after_th.join(PROBE_S + 5)
    res["after"] = after_box.get("answer") or "the probes did not finish"
    noticed = wait_noticed(poll, 2.0)
    close_watch()
    res["noticed_s"] = None if noticed is None else round(noticed - wall0, 2)
    pub_end = time.monotonic()
    pub.finish()
    consumer.stopping = True
    consumer.join(5)
    res["drained"] = drain([url, cluster.node_url(victim)], queue, ledger)
    res.update(summary(ledger, pub, consumer, t0, up, pub_end))
    res.update(cluster.partitions() if fault == "hang" else {})
    log(f"{cluster.label} {kind}/{fault}: {json.dumps(res, default=str)}")
    return res


def summary(ledger: Ledger, pub: Publisher, consumer: Consumer, t0: float, up: float,
            end: float) -> dict:
    """The clients' view of the fault (``t0``) to the victim's return (``up``) and after;
    acked messages never received (lost), by when they were acked."""
    phases = {"before": lambda t: t <= t0, "down": lambda t: t0 < t <= up,
              "after": lambda t: t > up}
    lost = [t for seq, t in ledger.acked.items() if seq not in ledger.received]
    rel = lambda events: [f"{what} at {t - t0:+.1f} s" for t, what in events]  # noqa: E731
    return {"longest_ack_gap_s": pub.longest_gap(t0, end), "published": pub.seq,
            "nacks": len(pub.nacks), "nacks_down": len(list(filter(phases["down"], pub.nacks))),
            "unanswered": pub.unanswered, "publisher_events": rel(pub.events),
            "consumer_events": rel(consumer.events),
            "consumer_deliveries": {k: sum(map(f, consumer.deliveries))
                                    for k, f in phases.items() if k != "before"},
            "acked": len(ledger.acked), "lost": len(lost),
            "lost_by_phase": {k: f"{sum(map(f, lost))} of {sum(map(f, ledger.acked.values()))}"
                              for k, f in phases.items()}}


def run_round(cluster, only: list[tuple[str, str]]) -> list[dict]:
    rows = []
    cluster.start()
    try:
        for kind, fault in only:
            try:
                rows.append(scenario(cluster, kind, fault))
            except Exception as exc:  # noqa: BLE001 - recorded; the next scenario still runs
                log(f"{cluster.label} {kind}/{fault} FAILED: {type(exc).__name__}: {exc}")
                rows.append({"queue_type": kind, "fault": fault,
                             "error": f"{type(exc).__name__}: {exc}"})
            time.sleep(3)
    finally:
        cluster.stop()
        getattr(cluster, "cleanup_epmd", lambda: None)()
    return rows


# -- table --------------------------------------------------------------------------------
HEADER = ["round", "queue", "fault", "victim (down s)", "noticed after (s)",
          "declare while down", "consume while down", "get while down",
          "confirmed publish while down", "existing consumer", "longest ack gap (s)",
          "steady publisher", "probes at return", "works again after return (s)",
          "lost of acked (by when acked)"]


def answer(box: dict) -> str:
    s = box.get("s")
    return box["answer"] + (f" ({s:.1f} s)" if s is not None and s >= 0.1 else "")


def probes_cells(probes) -> list[str]:
    if not isinstance(probes, dict):
        return [str(probes)] * 4
    return [answer(probes[n]) for n in ("declare", "consume", "get", "publish")]


def after_cell(probes) -> str:
    if isinstance(probes, dict) and all(b["answer"].startswith(("ok", "ack"))
                                        and (b.get("s") or 0) < 1 for b in probes.values()):
        return "all ok"
    return "; ".join(f"{n}: {c}" for n, c in zip(("declare", "consume", "get", "publish"),
                                                  probes_cells(probes)))


def row_cells(i: int, r: dict) -> list[str]:
    head = [str(i), r["queue_type"], r["fault"]]
    if "error" in r:
        return head + [f"not measured: {r['error']}"] + [""] * (len(HEADER) - 4)
    works = r["works_again"]
    works_s = f"none within {WORKS_CAP_S:.0f} s" if works["s"] is None else str(works["s"])
    works_s += f" (node boot {r['boot_s']})" if "boot_s" in r else ""
    works_s += f"; first: {works['first_failure']}" if works.get("first_failure") else ""
    consumer = (", ".join(r["consumer_events"]) or "nothing") + "; deliveries: " + ", ".join(
        f"{v} {k}" for k, v in r["consumer_deliveries"].items())
    pub = (f"{r['nacks']} nacks ({r['nacks_down']} while down), {r['unanswered']} "
           f"unanswered; " + (", ".join(r["publisher_events"]) or "no close"))
    lost = f"{r['lost']} of {r['acked']} (" + ", ".join(
        f"{k}: {v}" for k, v in r["lost_by_phase"].items()) + ")"
    if r["drained"].startswith("failed"):
        lost += "; not drained, an upper bound"
    noticed = "not noticed" if r["noticed_s"] is None else str(r["noticed_s"])
    return head + [f"{r['victim']} ({r['down_s']})", noticed,
                   *probes_cells(r["during"]), consumer, str(r["longest_ack_gap_s"]), pub,
                   after_cell(r["after"]), works_s, lost]


def render(rounds: list[list[dict]]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(c.replace("|", "/") for c in row_cells(i, r)) + " |"
              for i, rows in enumerate(rounds, 1) for r in rows]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--broker", choices=["rabbitmq", "shoal"], required=True)
    p.add_argument("--repeat", type=int, default=1, help="rounds, each on a fresh cluster")
    p.add_argument("--only", default="", help="scenarios, e.g. classic-kill,quorum-stop")
    p.add_argument("--work", default="", help="work folder (default: a new temp folder)")
    args = p.parse_args(argv)
    only = [s for s in SCENARIOS if not args.only or "-".join(s) in args.only.split(",")]
    work = Path(args.work or tempfile.mkdtemp(prefix="failure-table-")).resolve()
    work.mkdir(parents=True, exist_ok=True)

    def _exit(signum, _frame):
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, _exit)
    signal.signal(signal.SIGINT, _exit)
    cluster = RabbitCluster(work) if args.broker == "rabbitmq" else ShoalCluster(work, [])
    rounds: list[list[dict]] = []
    log(f"work folder {work}")
    for i in range(args.repeat):
        log(f"round {i + 1}/{args.repeat}: {cluster.label}")
        try:
            rounds.append(run_round(cluster, only))
        finally:
            (work / "results.json").write_text(json.dumps(
                {"broker": args.broker, "rounds": rounds}, indent=2, default=str) + "\n")
    print(render(rounds))
    log(f"results in {work / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
