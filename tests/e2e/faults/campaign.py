"""A Jepsen-style fault campaign (issue 36, part 3): a real cluster of 3 nodes and 2 routers,
each process in its own network namespace on this machine (tests/e2e/faults/netns.py), under
confirmed persistent load on classic and quorum queues, with faults injected round after round;
then the whole history is checked (tests/e2e/faults/history.py).

Each round waits a moment, then injects one or two faults, each held 1 to 6 s and healed:

- ``kill``: kill -9 of a node or a router, restarted with the same command (same data dir);
- ``pause``: SIGSTOP, then SIGCONT, of a node or a router;
- ``cut``: both ways between two nodes, a router and a node, or the clients and a router (nft
  rules in the namespaces);
- ``oneway``: the same, one direction only;
- ``wipe``: kill -9 of a node, its data directory deleted, restarted.

At most one fault per round touches the nodes' majority (a node killed, paused or wiped, or a
cut between two nodes) and at most one makes a router unreachable, so quorum queues keep a
majority and the clients a router. After each round the campaign waits until every process is
back, every queue confirms and delivers again and, after a wipe, the wiped node is a voter of
every quorum queue again (:meth:`Campaign.recover`). What does not recover within 60 s, a
process that exits on its own (restarted), a consumer that gets nothing for 10 s while its
queue confirms (subscribed again) and a confirm that never comes (its connection cut after
30 s) are *notes*: liveness findings, printed with the figures. At the end: every fault
healed, the publishers stopped, every queue drained by fresh consumers, and
:func:`history.check`, whose violations decide PASS or FAIL.

The fault schedule is a function of ``--seed`` only (:func:`plan`): ``--seed S --rounds N``
replays the first N rounds of seed S. Run as root::

    python -m tests.e2e.faults.campaign --rounds 10 --seed 1 [--keep] [--figures FILE]

CI runs it through tests/e2e/faults/test_campaign.py (``SHOAL_CAMPAIGN_ROUNDS``).
"""
from __future__ import annotations

import argparse
import collections
import json
import random
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pika

from shoal.shared.placement import owner

from . import netns
from .campaign_clients import Consumer, Publisher, Watchdog, close, drain, params
from .history import Fault, History, Round, Verdict, check
from .netns import CLIENTS, NODES, ROUTERS, Net, Proc

KINDS = ("kill", "pause", "cut", "oneway", "wipe")
PUBLISHERS, RATE = 4, 40.0          #: publisher threads, messages per second each
READY_TIMEOUT = 60.0                #: s for a (re)started process to print its ready line
RECOVERY_TIMEOUT = 60.0             #: s for the cluster to serve every queue after a round
STALL = 10.0                        #: s a consumer may get nothing while its queue confirms
LOCK_TIMEOUT = 900.0                #: s to wait for another run on this machine to finish


def say(text: str) -> None:
    """The campaign's progress lines (flushed: a long run is followed in its output file)."""
    print(text, flush=True)


def name(member: str) -> str:
    """n1 -> node-1, r0 -> router-0, clients -> clients."""
    return {"n": "node-", "r": "router-"}.get(member[0], "") + member[1:] \
        if member != CLIENTS else CLIENTS


@dataclass(frozen=True)
class FaultSpec:
    """One planned fault: ``kind`` on ``members`` (one process, or a pair ``a``, ``b``: a cut
    of a -> b, and b -> a too for ``cut``), starting ``offset`` s into the round's fault
    phase, held ``hold`` s."""

    kind: str
    members: tuple[str, ...]
    hold: float
    offset: float

    def target(self) -> str:
        if len(self.members) == 1:
            return name(self.members[0])
        arrow = "<->" if self.kind == "cut" else "->"
        return arrow.join(name(m) for m in self.members)

    def hits_nodes(self) -> bool:
        """Takes a node from the others (so a second such fault could cost the majority)."""
        return all(m in NODES for m in self.members)

    def hits_router(self) -> bool:
        """Takes a router from the clients."""
        return (len(self.members) == 1 and self.members[0] in ROUTERS) or CLIENTS in self.members


def _pick(rnd: random.Random) -> FaultSpec:
    kind = rnd.choice(KINDS)
    if kind == "wipe":
        members = (rnd.choice(NODES),)
    elif kind in ("kill", "pause"):
        members = (rnd.choice(NODES + ROUTERS),)
    else:
        pair = rnd.choice(("node-node", "router-node", "clients-router"))
        if pair == "node-node":
            members = tuple(rnd.sample(NODES, 2))
        elif pair == "router-node":
            members = (rnd.choice(ROUTERS), rnd.choice(NODES))
        else:
            members = (CLIENTS, rnd.choice(ROUTERS))
        if kind == "oneway" and rnd.random() < 0.5:
            members = members[::-1]
    return FaultSpec(kind, members, round(rnd.uniform(1.0, 6.0), 2), 0.0)


def plan(seed: int, rounds: int) -> list[tuple[float, list[FaultSpec]]]:
    """The schedule: for each round, the calm before it (s) and its one or two faults. A
    function of ``seed`` alone; the first N rounds are the same for any ``rounds`` >= N."""
    rnd = random.Random(seed)
    out = []
    for _ in range(rounds):
        calm = round(rnd.uniform(0.5, 2.0), 2)
        faults: list[FaultSpec] = []
        want = rnd.choice((1, 2))
        while len(faults) < want:
            f = _pick(rnd)
            if faults:
                g = faults[0]
                if set(f.members) & set(g.members) - {CLIENTS} \
                        or (f.hits_nodes() and g.hits_nodes()) \
                        or (f.hits_router() and g.hits_router()):
                    continue
                f = FaultSpec(f.kind, f.members, f.hold, round(rnd.uniform(0.0, 2.0), 2))
            faults.append(f)
        out.append((calm, faults))
    return out


def queue_names(node_ids: list[str]) -> dict[str, tuple[str, dict]]:
    """A classic and a quorum queue and a stream owned by (led first from) each node: name ->
    (type, args)."""
    out = {}
    for kind, args in (("classic", {}), ("quorum", {"x-queue-type": "quorum"}),
                       ("stream", {"x-queue-type": "stream"})):
        for i, nid in enumerate(node_ids):
            k = 0
            while owner("/", f"camp-{kind[:1]}{i}-{k}", node_ids) != nid:
                k += 1
            out[f"camp-{kind[:1]}{i}-{k}"] = (kind, args)
    return out


class Campaign:
    """The cluster, the clients and the history of one run."""

    def __init__(self, run_dir: Path, seed: int, log=say) -> None:
        self.run_dir, self.seed, self.log = run_dir, seed, log
        run_dir.mkdir(parents=True, exist_ok=True)
        self.net, self.lock = Net(), netns.RunLock()
        self.procs: dict[str, Proc] = netns.make_procs(run_dir)
        self.node_ids = [self.procs[m].name for m in NODES]
        self.queues = queue_names(self.node_ids)
        self.hist = History({q: kind for q, (kind, _) in self.queues.items()})
        self.routers = [netns.address(m) for m in ROUTERS]
        self.publishers: list[Publisher] = []
        self.consumers: list[Consumer] = []
        self.watchdog: Watchdog | None = None
        self.wiped_at: dict[str, dict[str, int]] = {}   # node member -> log offsets at the wipe

    # ---- the cluster ---------------------------------------------------------------------
    def start(self) -> None:
        """Network up, nodes, then routers, then the queues and the clients (after waiting for
        another run on this machine, whose names these are, to finish)."""
        self.lock.acquire(LOCK_TIMEOUT, self.log)
        left = Net.clean_leftovers()
        if left:
            self.log(f"campaign: removed leftovers of an earlier run: {', '.join(left)}")
        self.net.up()
        for group in (NODES, ROUTERS):
            for m in group:
                self.procs[m].start()
            for m in group:
                if not self.procs[m].wait_ready(READY_TIMEOUT):
                    raise RuntimeError(f"{self.procs[m].name} did not start\n"
                                       f"{self.procs[m].tail()}")
        self._declare_all(self.routers[0], RECOVERY_TIMEOUT)
        self.publishers = [Publisher(f"p{i}", self.hist, self.routers[i % 2:] +
                                     self.routers[:i % 2], list(self.queues), RATE,
                                     self.seed * 1000 + i) for i in range(PUBLISHERS)]
        self.consumers = [Consumer(self.hist, self.routers[i % 2:] + self.routers[:i % 2], q,
                                   args) for i, (q, (_, args)) in enumerate(self.queues.items())]
        self.watchdog = Watchdog(self.hist, self.publishers)
        for t in [*self.consumers, *self.publishers, self.watchdog]:
            t.start()

    def _declare_all(self, host: str, timeout: float) -> None:
        """Declare every queue through the router at ``host`` (again: a wiped classic queue
        is gone), retrying until ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            conn = None
            try:
                conn = pika.BlockingConnection(params(host))
                ch = conn.channel()
                for q, (_, args) in self.queues.items():
                    ch.queue_declare(q, durable=True, arguments=args)
                return
            except Exception as exc:  # noqa: BLE001 - not yet: retry until the deadline
                if time.monotonic() > deadline:
                    raise RuntimeError(f"cannot declare the queues through {host}: "
                                       f"{exc!r}") from exc
                time.sleep(0.3)
            finally:
                close(conn)

    def stop(self) -> None:
        """Clients, processes, network: everything goes, whatever state it is in."""
        for t in [*self.publishers, *self.consumers] + ([self.watchdog] if self.watchdog else []):
            t.stop.set()
        for p in self.procs.values():
            try:
                p.stop()
            except Exception as exc:  # noqa: BLE001 - go on removing the rest
                self.log(f"campaign: stopping {p.name}: {exc!r}")
        if self.lock.fd is not None:        # never remove another run's network
            self.net.down()
        self.lock.release()

    def tails(self, lines: int = 30) -> str:
        return "\n".join(f"--- {p.name} ({p.log}) ---\n{p.tail(lines)}"
                         for p in self.procs.values())

    # ---- faults --------------------------------------------------------------------------
    def apply(self, spec: FaultSpec) -> None:
        """Inject ``spec``: kill -9 (and delete the data directory for a wipe), SIGSTOP, or the
        nft drops of a cut."""
        m = spec.members
        if spec.kind in ("kill", "wipe"):
            proc = self.procs[m[0]]
            if spec.kind == "wipe":
                self.wiped_at[m[0]] = {p.name: p.log.stat().st_size
                                       for p in self.procs.values() if p.log.exists()}
            proc.kill9()
            if spec.kind == "wipe":
                shutil.rmtree(proc.data_dir, ignore_errors=True)
        elif spec.kind == "pause":
            self.procs[m[0]].signal(signal.SIGSTOP)
        else:
            self.net.add(netns.cut_rules(m[0], m[1], both=spec.kind == "cut"))

    def heal(self, spec: FaultSpec) -> None:
        """Undo ``spec``: restart with the same command (a wipe's classic queues are recorded
        as lost from now back), SIGCONT, or remove the drops."""
        m = spec.members
        if spec.kind in ("kill", "wipe"):
            self.procs[m[0]].start()
            if spec.kind == "wipe":
                nid = self.procs[m[0]].name
                for q, (kind, _) in self.queues.items():
                    if kind == "classic" and owner("/", q, self.node_ids) == nid:
                        self.hist.wipes.append((q, time.monotonic(), self.hist.round))
        elif spec.kind == "pause":
            self.procs[m[0]].signal(signal.SIGCONT)
        else:
            self.net.remove(netns.cut_rules(m[0], m[1], both=spec.kind == "cut"))

    def run_round(self, index: int, calm: float, specs: list[FaultSpec]) -> Round:
        """The calm, the faults applied and healed at their times, then :meth:`recover`."""
        self.hist.round = index
        rnd = Round(index, time.monotonic())
        faults = [Fault(index, s.kind, s.target(), s.hold) for s in specs]
        rnd.faults = faults
        self.hist.rounds.append(rnd)
        time.sleep(calm)
        began = time.monotonic()
        events = sorted([(s.offset, 0, i) for i, s in enumerate(specs)] +
                        [(s.offset + s.hold, 1, i) for i, s in enumerate(specs)])
        for at, heal, i in events:
            time.sleep(max(0.0, began + at - time.monotonic()))
            if heal:
                self.heal(specs[i])
                faults[i].t1 = time.monotonic()
            else:
                faults[i].t0 = time.monotonic()
                self.apply(specs[i])
        rnd.t_healed = time.monotonic()
        rnd.recovered_s = self.recover(specs)
        return rnd

    # ---- recovery ------------------------------------------------------------------------
    def recover(self, specs: list[FaultSpec] = (), timeout: float = RECOVERY_TIMEOUT) -> float:
        """Wait until the cluster serves again: every process up and ready (one that exited
        on its own is noted and restarted), every queue declared through each router, a
        confirm and a delivery on every queue since now, every publisher back on its home
        router and, after a wipe, the wiped node a voter of every quorum queue. Returns the
        seconds it took; what did not recover within ``timeout`` is noted in the history."""
        t0 = time.monotonic()
        deadline = t0 + timeout
        for p in self.procs.values():
            if not p.alive():
                code = p.popen.returncode if p.popen else None
                p.exits.append((t0, code))
                self.hist.note(f"{p.name} exited on its own (code {code}); restarted. "
                               f"Log tail:\n{p.tail(15)}")
                p.start()
        for p in self.procs.values():
            if not p.wait_ready(max(1.0, deadline - time.monotonic())):
                self.hist.note(f"{p.name} not ready after a fault; log tail:\n{p.tail(15)}")
        for host in self.routers:
            try:
                self._declare_all(host, max(1.0, deadline - time.monotonic()))
            except RuntimeError as exc:
                self.hist.note(str(exc))
        pending = self._progress(t0, deadline)
        while any(t.home_since is not None for t in self.publishers) \
                and time.monotonic() < deadline:
            time.sleep(0.1)                 # publishers back on their home router
        wiped = [m for s in specs if s.kind == "wipe" for m in s.members]
        for m in wiped:
            pending += self._rejoined(m, deadline)
        if pending:
            self.hist.note(f"not recovered within {timeout:.0f} s: {'; '.join(pending)}")
        return time.monotonic() - t0

    def _progress(self, since: float, deadline: float) -> list[str]:
        """Wait for a confirm and a delivery on every queue after ``since``; what is missing.
        A consumer that gets nothing for :data:`STALL` s while its queue confirms is noted
        (with what the broker says of the queue) and subscribes again."""
        start = max(0, len(self.hist.publishes) - 10 * PUBLISHERS)
        stalled: set[str] = set()
        while True:
            confirmed = {p.queue for p in self.hist.publishes[start:]
                         if p.outcome == "confirmed" and p.t1 is not None and p.t1 > since}
            delivered = {q for q, s in self.hist.deliveries.items() if s and s[-1].t > since}
            missing = [f"no confirm on {q}" for q in self.queues if q not in confirmed] + \
                      [f"no delivery on {q}" for q in self.queues if q not in delivered]
            if not missing or time.monotonic() > deadline:
                return missing
            if time.monotonic() > since + STALL:
                for c in self.consumers:
                    if c.queue in confirmed and c.queue not in delivered | stalled \
                            and c.router:
                        stalled.add(c.queue)
                        self.hist.note(f"the consumer of {c.queue} (through {c.router}, "
                                       f"subscribed, no basic.cancel) got nothing for "
                                       f"{STALL:.0f} s while its queue confirmed; the broker "
                                       f"says {self._queue_state(c.queue)}; it subscribes "
                                       f"again")
                        c.resubscribe.set()
            time.sleep(0.1)

    def _queue_state(self, queue: str) -> str:
        """Messages and consumers of ``queue`` as each router sees them (passive declare)."""
        out = []
        for host in self.routers:
            conn = None
            try:
                conn = pika.BlockingConnection(params(host))
                ok = conn.channel().queue_declare(queue, passive=True).method
                out.append(f"{host}: {ok.message_count} messages, {ok.consumer_count} consumers")
            except Exception as exc:  # noqa: BLE001 - evidence only
                out.append(f"{host}: {type(exc).__name__}")
            finally:
                close(conn)
        return "; ".join(out)

    def _rejoined(self, member: str, deadline: float) -> list[str]:
        """After a wipe of ``member``: wait until its new member id is added as a voter to every
        quorum queue and stream (the leaders' log lines ``quorum queue 'Q': add node-N@...``,
        ``stream 'S' in vhost '/': add node-N@...``)."""
        nid = self.procs[member].name
        qqs = [q for q, (kind, _) in self.queues.items() if kind in ("quorum", "stream")]
        while True:
            lines = netns.log_lines_since([self.procs[m] for m in NODES],
                                          rf"(quorum queue|stream) '[^']+'"
                                          rf"( in vhost '/')?: add {nid}@",
                                          self.wiped_at.get(member, {}))
            missing = [q for q in qqs if not any(
                f"'{q}': add {nid}@" in ln or f"'{q}' in vhost '/': add {nid}@" in ln
                for ln in lines)]
            if not missing or time.monotonic() > deadline:
                return [f"{nid} not a voter again of {', '.join(missing)}"] if missing else []
            time.sleep(0.2)

    # ---- the end -------------------------------------------------------------------------
    def finish(self) -> Verdict:
        """Heal everything, stop publishing, wait for the cluster, drain every queue with fresh
        consumers, check the history."""
        self.net.heal_all()
        for p in self.procs.values():
            if p.paused:
                p.signal(signal.SIGCONT)
        self.recover()
        for t in self.publishers:
            t.stop.set()
        for t in self.publishers:
            t.join(60)
            if t.is_alive():
                self.hist.note(f"publisher {t.pub} did not stop within 60 s")
        self.hist.t_stop_publishing = time.monotonic()
        self.hist.round = len(self.hist.rounds) + 1        # the drain
        time.sleep(1.0)
        for t in self.consumers:
            t.stop.set()
        for t in self.consumers:
            t.join(30)
        offsets = {c.queue: c.offset for c in self.consumers}
        for q, (_, args) in self.queues.items():
            if not drain(self.hist, self.routers, q, args, offset=offsets.get(q) or None):
                self.hist.note(f"{q} not empty after draining for 60 s")
        self.watchdog.stop.set()
        return check(self.hist)


def run(rounds: int, seed: int, run_dir: Path, log=say) -> tuple[Verdict, Campaign]:
    """Start the cluster in ``run_dir``, run ``rounds`` rounds of :func:`plan`, check; the
    cluster and network are removed whatever happens."""
    camp = Campaign(run_dir, seed, log)
    schedule = plan(seed, rounds)
    try:
        camp.start()
        time.sleep(2.0)
        seen = 0
        for i, (calm, specs) in enumerate(schedule, 1):
            rnd = camp.run_round(i, calm, specs)
            log(f"round {i}: {' + '.join(f.text() for f in rnd.faults)}; recovered in "
                f"{rnd.recovered_s:.1f} s; confirmed so far "
                f"{sum(p.outcome == 'confirmed' for p in camp.hist.publishes)}")
            for note in camp.hist.notes[seen:]:
                log(f"  note: {note}")
            seen = len(camp.hist.notes)
        verdict = camp.finish()
        if not verdict.ok:
            log("campaign: violations found; log tails:\n" + camp.tails(15))
    except BaseException:
        log("campaign: failed; log tails:\n" + camp.tails())
        raise
    finally:
        camp.stop()
    verdict.figures["seed"] = seed
    verdict.figures["unexpected_exits"] = {p.name: len(p.exits) for p in camp.procs.values()
                                           if p.exits}
    verdict.figures["client_errors"] = dict(sum(
        (t.errors for t in [*camp.publishers, *camp.consumers]), collections.Counter()))
    return verdict, camp


def _on_sigterm(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.e2e.faults.campaign",
                                 description="fault rounds on a namespaced cluster, then a "
                                             "history check")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep", action="store_true", help="keep the run directory (logs)")
    ap.add_argument("--figures", type=Path, help="write the figures and violations (JSON) here")
    ap.add_argument("--plan", action="store_true", help="print the schedule and exit")
    a = ap.parse_args(argv)
    if a.plan:
        for i, (calm, specs) in enumerate(plan(a.seed, a.rounds), 1):
            print(f"round {i}: calm {calm} s; " + " + ".join(
                f"{s.kind} {s.target()} {s.hold} s at +{s.offset} s" for s in specs))
        return 0
    missing = netns.missing_tools()
    if missing:
        print(f"campaign: cannot run without {', '.join(missing)}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _on_sigterm)
    run_dir = Path(tempfile.mkdtemp(prefix="shoal-campaign-"))
    ok = False
    try:
        verdict, camp = run(a.rounds, a.seed, run_dir)
        ok = verdict.ok
        for line in verdict.lines():
            print(line)
        errors = collections.Counter(verdict.figures["client_errors"])
        print(f"processes that exited on their own: {verdict.figures['unexpected_exits']}; "
              f"client errors {sum(errors.values())}, most common {errors.most_common(4)}")
        for note in camp.hist.notes:
            print(f"note: {note}")
        for v in verdict.violations:
            print(f"VIOLATION rule {v.rule}: {v.text}")
        if a.figures:
            a.figures.write_text(json.dumps(
                {"figures": verdict.figures, "violations": [v.__dict__ for v in
                                                            verdict.violations],
                 "notes": camp.hist.notes}, indent=1, default=str))
        print("PASS" if ok else "FAIL")
        if a.keep or not ok:
            camp.hist.dump(run_dir / "history.jsonl")
    finally:
        if a.keep or not ok:
            print(f"campaign: logs kept in {run_dir}")
        else:
            shutil.rmtree(run_dir, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
