"""The Raft core (node/replication/raft.py) against the Raft paper, section by section, in the
manner of etcd's raft_paper_test.go; then the extensions (pre-vote, check-quorum, snapshots,
learners, ``peer_lost``, membership repair). Every test drives :class:`Raft` through the host
protocol of its docstring (a :class:`Net` persists each Ready at once, sends its messages, applies
its committed entries, and calls ``advance``), so what a test sees is what a host would.

The seeded simulator (sim.py, test_raft_sim.py) explores interleavings; these pin the rules.
"""
from __future__ import annotations

import random

import pytest

from shoal.node.replication import membership, raft as raft_module
from shoal.node.replication.log import (ADD_LEARNER, ADD_VOTER, CONF, NORMAL, REMOVE, Entry,
                                        Snapshot)
from shoal.node.replication.raft import (APP, APP_RESP, CANDIDATE, FOLLOWER, HEARTBEAT,
                                         HEARTBEAT_RESP, LEADER, PRE_CANDIDATE, PRE_VOTE, SNAP,
                                         VOTE, VOTE_RESP, HardState, Message, Raft)

ET = 10     # election ticks


def make(id: str, voters, *, terms=(), term: int = 0, vote: str | None = None, commit: int = 1,
         learners=(), pre_vote: bool = False, check_quorum: bool = False, seed: int = 0,
         sm: list | None = None) -> Raft:
    """A member restored from a disk holding the group's first snapshot (index 1, term 1,
    ``voters``/``learners``), entries of ``terms`` from index 2 on, and a hard state. Basic Raft
    (no pre-vote, no check-quorum) unless asked. ``sm``: the state machine ``snapshot_source``
    reads (the Net fills it)."""
    snap = Snapshot(1, 1, tuple(sorted(voters)), tuple(sorted(learners)), ())
    entries = [Entry(t, i, NORMAL, f"e{i}t{t}") for i, t in enumerate(terms, start=2)]
    state = sm if sm is not None else []
    return Raft(id, snapshot=snap, entries=entries, hard_state=HardState(term, vote, commit),
                election_ticks=ET, heartbeat_ticks=1, rng=random.Random(f"{id}{seed}"),
                pre_vote=pre_vote, check_quorum=check_quorum,
                snapshot_source=lambda: tuple(state))


def ready_msgs(r: Raft) -> list[Message]:
    """Run the host protocol on one member alone (persist, apply, advance); its messages."""
    out = []
    while r.has_ready():
        rd = r.ready()
        out += rd.messages
        r.advance(rd)
    return out


def types(msgs) -> list[tuple]:
    return sorted((m.type, m.to) for m in msgs)


class Net:
    """Members that exchange messages in order, each a host that persists its Ready at once.
    ``cut``: directed (from, to) links that lose everything; ``down``: members not running.
    ``applied[id]``: what each member applied, as (index, term, data); ``sm[id]`` its state
    machine as the snapshots carry it."""

    def __init__(self, ids, *, learners=(), **kw) -> None:
        voters = [i for i in ids if i not in learners]
        self.sm: dict[str, list] = {i: [] for i in ids}
        self.rafts = {i: make(i, voters, learners=learners, sm=self.sm[i], **kw) for i in ids}
        self.applied: dict[str, list] = {i: [] for i in ids}
        self.cut: set[tuple[str, str]] = set()
        self.down: set[str] = set()
        self.queue: list[Message] = []
        self.sent: list[Message] = []
        for i in ids:
            self.pump(i)

    def __getitem__(self, id: str) -> Raft:
        return self.rafts[id]

    def add(self, id: str, r: Raft, sm: list) -> None:
        self.rafts[id], self.sm[id], self.applied[id] = r, sm, []
        self.pump(id)

    def pump(self, id: str) -> None:
        r = self.rafts[id]
        while r.has_ready():
            rd = r.ready()
            for m in rd.messages:               # through the wire format, as a host would
                self.queue.append(Message.from_wire(m.to_wire()))
            self.sent += rd.messages
            if rd.snapshot is not None:
                self.sm[id][:] = list(rd.snapshot.data)
            for e in rd.committed:
                self.applied[id].append((e.index, e.term, e.data))
                self.sm[id].append((e.index, e.term, e.kind, e.data))
            r.advance(rd)

    def run(self, limit: int = 10000) -> None:
        """Deliver until no message is left."""
        while self.queue and limit:
            limit -= 1
            m = self.queue.pop(0)
            if m.to in self.down or m.frm in self.down or (m.frm, m.to) in self.cut \
                    or m.to not in self.rafts:
                continue
            self.rafts[m.to].step(m)
            self.pump(m.to)

    def tick(self, id: str, n: int = 1) -> None:
        for _ in range(n):
            self.rafts[id].tick()
            self.pump(id)
            self.run()

    def tick_all(self, n: int = 1) -> None:
        for _ in range(n):
            for i in sorted(self.rafts):
                if i not in self.down:
                    self.rafts[i].tick()
                    self.pump(i)
            self.run()

    def campaign(self, id: str) -> None:
        self.rafts[id].campaign()
        self.pump(id)
        self.run()

    def propose(self, id: str, data) -> int | None:
        index = self.rafts[id].propose(data)
        self.pump(id)
        self.run()
        return index

    def isolate(self, id: str) -> None:
        for other in self.rafts:
            if other != id:
                self.cut |= {(id, other), (other, id)}

    def heal(self) -> None:
        self.cut.clear()

    def leaders(self) -> list[str]:
        return [i for i, r in sorted(self.rafts.items())
                if i not in self.down and r.state == LEADER]


# ---- 5.1 Raft basics: terms ---------------------------------------------------------------------

@pytest.mark.parametrize("state", [FOLLOWER, CANDIDATE, LEADER])
@pytest.mark.parametrize("kind", [APP, HEARTBEAT, VOTE])
def test_5_1_a_message_of_a_higher_term_updates_the_term_and_makes_a_follower(state, kind):
    r = make("a", "abc", term=1)
    if state == CANDIDATE:
        r.campaign()
    elif state == LEADER:
        r.campaign()
        for p in "bc":
            r.step(Message(VOTE_RESP, p, "a", r.term))
    assert r.state == state
    r.step(Message(kind, "b", "a", 5, log_term=1, index=1))
    assert (r.term, r.state) == (5, FOLLOWER)
    assert r.leader == ("b" if kind in (APP, HEARTBEAT) else None)


@pytest.mark.parametrize("kind", [APP, HEARTBEAT])
def test_5_1_a_stale_leader_is_answered_with_the_current_term_and_steps_down(kind):
    """With pre-vote (or check-quorum) a member answers a stale leader (etcd: a deposed leader
    that no higher-term message reaches would otherwise never learn the term)."""
    net = Net("abc", pre_vote=True)
    net.campaign("a")
    assert net.leaders() == ["a"] and net["a"].term == 1
    net.isolate("a")
    net.campaign("b")
    assert net["b"].state == LEADER and net["b"].term == 2
    old = net["a"]
    last = net["b"].last_index
    # the deposed leader's message (term 1) is not acted on, and its answer carries term 2
    net["c"].step(Message(kind, "a", "c", 1, log_term=1, index=2,
                          entries=[Entry(1, 3, NORMAL, "stale")], commit=3))
    resp = ready_msgs(net["c"])
    assert [(m.type, m.to, m.term) for m in resp] == [(APP_RESP, "a", 2)]
    assert net["c"].last_index == last and net["c"].commit <= last
    old.step(resp[0])
    assert (old.state, old.term) == (FOLLOWER, 2)


def test_5_1_a_message_of_an_older_term_is_not_acted_on():
    r = make("a", "abc", term=3)
    r.step(Message(VOTE, "b", "a", 2, log_term=9, index=9))
    r.step(Message(VOTE_RESP, "b", "a", 2))
    assert (r.term, r.vote, r.state) == (3, None, FOLLOWER)
    assert ready_msgs(r) == []


# ---- 5.2 Leader election ------------------------------------------------------------------------

def test_5_2_members_start_as_followers():
    r = make("a", "abc", term=2)
    assert (r.state, r.term, r.leader) == (FOLLOWER, 2, None)


def test_5_2_a_leader_sends_heartbeats_every_heartbeat_interval():
    net = Net("abc")
    net.campaign("a")
    ready_msgs(net["a"])
    net["a"].tick()
    assert types(ready_msgs(net["a"])) == [(HEARTBEAT, "b"), (HEARTBEAT, "c")]


@pytest.mark.parametrize("state", [FOLLOWER, CANDIDATE])
def test_5_2_a_member_that_hears_from_no_leader_campaigns(state):
    r = make("a", "abc", terms=[1], term=1)
    if state == CANDIDATE:
        r.campaign()
        ready_msgs(r)
    term = r.term
    for _ in range(2 * ET):
        r.tick()
        if r.term > term:
            break
    assert (r.state, r.term, r.vote) == (CANDIDATE, term + 1, "a")
    rd = r.ready()
    assert (rd.hard_state.term, rd.hard_state.vote) == (term + 1, "a")   # persisted with ...
    assert [(m.type, m.to, m.term, m.index, m.log_term) for m in rd.messages] == \
        [(VOTE, "b", term + 1, 2, 1), (VOTE, "c", term + 1, 2, 1)]       # ... the requests


@pytest.mark.parametrize("size,grants,rejects,won", [
    (1, [], [], True),
    (3, ["b"], [], True),
    (3, ["b", "c"], [], True),
    (3, [], ["b"], None),
    (3, [], ["b", "c"], False),
    (5, ["b", "c"], [], True),
    (5, ["b"], ["c"], None),
    (5, ["b"], ["c", "d", "e"], False),
    (5, ["b", "c"], ["d", "e"], True),
])
def test_5_2_an_election_is_won_in_one_round_by_a_majority(size, grants, rejects, won):
    ids = "abcde"[:size]
    r = make("a", ids)
    r.campaign()
    ready_msgs(r)
    for p in grants:
        r.step(Message(VOTE_RESP, p, "a", 1))
    for p in rejects:
        r.step(Message(VOTE_RESP, p, "a", 1, reject=True))
    expect = {True: LEADER, None: CANDIDATE, False: FOLLOWER}[won]
    assert (r.state, r.term) == (expect, 1)
    if won:     # a new leader asserts itself at once (an empty entry of its term, appended)
        assert r.log.entry(r.last_index).term == 1 and r.leader == "a"


def test_5_2_a_split_vote_elects_nobody_and_the_next_timeout_starts_a_new_term():
    net = Net("abcd")
    # a and b campaign at once; c votes for a, d for b: 2 of 4 each, no majority (and, as in
    # etcd, a candidate that can no longer win goes back to follower)
    net["a"].campaign()
    net["b"].campaign()
    net.pump("a")
    net.pump("b")
    order = {("a", "c"): 0, ("b", "d"): 0}
    net.queue.sort(key=lambda m: order.get((m.frm, m.to), 1))
    net.run()
    assert net.leaders() == []
    assert net["a"].state == net["b"].state == FOLLOWER
    assert net["a"].term == net["b"].term == 1
    assert (net["c"].vote, net["d"].vote) == ("a", "b")
    for _ in range(2 * ET):                     # timeouts differ: one of them goes first
        net.tick_all()
        if net.leaders():
            break
    assert len(net.leaders()) == 1
    assert net[net.leaders()[0]].term == 2


def test_5_2_a_candidate_steps_down_for_a_leader_of_its_term():
    r = make("a", "abc")
    r.campaign()
    r.step(Message(APP, "b", "a", 1, log_term=1, index=1, commit=1))
    assert (r.state, r.term, r.leader) == (FOLLOWER, 1, "b")


def test_5_2_a_candidate_steps_down_on_a_higher_term():
    r = make("a", "abc")
    r.campaign()
    r.step(Message(VOTE_RESP, "b", "a", 4, reject=True))
    assert (r.state, r.term, r.vote) == (FOLLOWER, 4, None)


def test_5_2_a_member_grants_one_vote_per_term_first_come_first_served():
    r = make("c", "abc")
    r.step(Message(VOTE, "a", "c", 1, log_term=1, index=1))
    r.step(Message(VOTE, "b", "c", 1, log_term=1, index=1))
    r.step(Message(VOTE, "a", "c", 1, log_term=1, index=1))     # a repeated request: granted
    rd = r.ready()
    assert rd.hard_state.vote == "a"
    assert [(m.to, m.reject) for m in rd.messages] == [("a", False), ("b", True), ("a", False)]
    r.advance(rd)
    r.step(Message(VOTE, "b", "c", 2, log_term=1, index=1))     # a new term: a new vote
    assert r.vote == "b"


def test_5_2_election_timeouts_are_randomized_in_one_to_two_election_timeouts():
    seen = set()
    for seed in range(200):
        r = make("a", "abc", seed=seed)
        ticks = 0
        while r.state == FOLLOWER:
            r.tick()
            ticks += 1
        assert ET <= ticks < 2 * ET
        seen.add(ticks)
    assert seen == set(range(ET, 2 * ET))


def test_5_2_members_time_out_at_different_ticks():
    firsts = []
    for seed in range(20):
        net = Net("abcde", seed=seed)
        order = []
        for _ in range(2 * ET):
            for i in "abcde":
                net[i].tick()
                if net[i].state == CANDIDATE and i not in order:
                    order.append(i)
        firsts.append(order[0])
    assert len(set(firsts)) > 1


# ---- 5.3 Log replication ------------------------------------------------------------------------

def test_5_3_a_new_leader_appends_an_empty_entry_and_sends_it_to_every_follower():
    r = make("a", "abc", terms=[1, 1], term=1, commit=3)
    r.campaign()
    ready_msgs(r)
    for p in "bc":
        r.step(Message(VOTE_RESP, p, "a", 2))
    rd = r.ready()
    assert [(e.index, e.term, e.data) for e in rd.entries] == [(4, 2, None)]
    assert [(m.type, m.to, m.index, m.log_term, [e.index for e in m.entries]) for m in
            rd.messages] == [(APP, "b", 3, 1, [4]), (APP, "c", 3, 1, [4])]


def test_5_3_the_leader_commits_on_a_majority_and_followers_apply_after_it():
    net = Net("abcde")
    net.campaign("a")
    net.down |= {"d", "e"}
    index = net.propose("a", "x")
    assert net["a"].commit == index and net["a"].log.entry(index).data == "x"
    net.tick("a")                                   # the heartbeat carries the commit index
    for p in "abc":
        assert (index, 1, "x") in net.applied[p]
        assert net[p].commit == index
    for p in "de":
        assert net.applied[p] == []


def test_5_3_without_a_majority_nothing_commits():
    net = Net("abcde")
    net.campaign("a")
    commit = net["a"].commit
    net.down |= {"c", "d", "e"}
    net.propose("a", "x")
    net.tick("a", 3)
    assert net["a"].commit == commit
    assert all(d != "x" for _, _, d in net.applied["a"])


def test_5_3_entries_are_persisted_in_the_ready_whose_messages_acknowledge_them():
    r = make("b", "abc", term=1)
    r.step(Message(APP, "a", "b", 1, log_term=1, index=1,
                   entries=[Entry(1, 2, NORMAL, "x"), Entry(1, 3, NORMAL, "y")], commit=1))
    rd = r.ready()
    assert [e.index for e in rd.entries] == [2, 3]
    assert [(m.type, m.index, m.reject) for m in rd.messages] == [(APP_RESP, 3, False)]


@pytest.mark.parametrize("index,log_term,ok", [
    (3, 2, True),       # matches the last entry
    (2, 1, True),       # matches an earlier one
    (3, 1, False),      # the term at 3 differs
    (4, 2, False),      # beyond the log
])
def test_5_3_a_follower_refuses_entries_after_an_entry_it_does_not_hold(index, log_term, ok):
    r = make("b", "abc", terms=[1, 2], term=2)
    r.step(Message(APP, "a", "b", 3, log_term=log_term, index=index,
                   entries=[Entry(3, index + 1, NORMAL, "x")], commit=1))
    (resp,) = ready_msgs(r)
    assert resp.type == APP_RESP and resp.reject is (not ok)
    if ok:
        assert resp.index == index + 1 and r.log.entry(index + 1).data == "x"
    else:
        assert resp.index == index and resp.reject_hint == 3


@pytest.mark.parametrize("terms,index,log_term,sent,want", [
    # (follower's terms from index 2; the APP's previous entry; its entries' terms; result)
    ([1, 2], 3, 2, [3], [1, 2, 3]),                 # append
    ([1, 2], 2, 1, [3], [1, 3]),                    # conflict at 3: truncate, append
    ([1, 2, 2, 2], 2, 1, [2], [1, 2, 2, 2]),        # already held: nothing is cut
    ([1, 2, 2, 2], 2, 1, [2, 3], [1, 2, 3]),        # conflict at 4: the rest goes
    ([1, 1, 1], 1, 1, [3, 3], [3, 3]),              # everything after the snapshot differs
])
def test_5_3_a_follower_deletes_conflicting_entries_and_keeps_the_rest(terms, index, log_term,
                                                                     sent, want):
    r = make("b", "abc", terms=terms, term=3)
    ents = [Entry(t, index + k, NORMAL, f"new{index + k}") for k, t in enumerate(sent, 1)]
    r.step(Message(APP, "a", "b", 3, log_term=log_term, index=index, entries=ents, commit=1))
    ready_msgs(r)
    assert [e.term for e in r.log.entries] == want


@pytest.mark.parametrize("follower_terms", [
    # Figure 7 of the paper: the leader's log [1,1,1,4,4,5,5,6,6,6] (indexes 2..11 here)
    [1, 1, 1, 4, 4, 5, 5, 6, 6],                    # (a) missing entries
    [1, 1, 1, 4],                                   # (b)
    [1, 1, 1, 4, 4, 5, 5, 6, 6, 6, 6],              # (c) extra uncommitted entries
    [1, 1, 1, 4, 4, 5, 5, 6, 6, 6, 7, 7],           # (d)
    [1, 1, 1, 4, 4, 4, 4],                          # (e) both
    [1, 1, 1, 2, 2, 2, 3, 3, 3, 3, 3],              # (f)
])
def test_5_3_the_leader_brings_every_follower_log_in_line_with_its_own(follower_terms):
    leader_terms = [1, 1, 1, 4, 4, 5, 5, 6, 6, 6]
    a = make("a", "abc", terms=leader_terms, term=8, commit=2)
    b = make("b", "abc", terms=follower_terms, term=8, commit=2)
    c = make("c", "abc", terms=[1], term=8, commit=2)
    net = Net("abc")
    for i, r in (("a", a), ("b", b), ("c", c)):
        net.add(i, r, [])
    # a wins term 9 with c's vote (b may refuse: its log can be longer), then syncs b
    net.cut |= {("a", "b"), ("b", "a")}
    net.campaign("a")
    assert net["a"].state == LEADER and net["a"].term == 9
    net.heal()
    net.tick("a", 3)
    lead = [(e.index, e.term, e.data) for e in net["a"].log.entries]
    assert [(e.index, e.term, e.data) for e in net["b"].log.entries] == lead
    assert net["b"].commit == net["a"].commit == 12


# ---- 5.4.1 Election restriction -----------------------------------------------------------------

@pytest.mark.parametrize("log_term,index,granted", [
    (1, 2, False),      # candidate's last term older
    (1, 3, False),
    (1, 4, False),
    (2, 2, False),      # same last term, shorter log
    (2, 3, True),       # same last term, same length
    (2, 4, True),       # same last term, longer
    (3, 2, True),       # newer last term, whatever the length
])
def test_5_4_1_a_voter_grants_only_a_candidate_at_least_as_up_to_date(log_term, index, granted):
    r = make("b", "abc", terms=[1, 2], term=2)         # last entry: index 3, term 2
    r.step(Message(VOTE, "a", "b", 3, log_term=log_term, index=index))
    (resp,) = ready_msgs(r)
    assert resp.type == VOTE_RESP and resp.reject is (not granted)
    assert r.vote == ("a" if granted else None)


def test_5_4_1_a_member_with_a_stale_log_cannot_win():
    net = Net("abc")
    net.campaign("a")
    net.isolate("c")
    net.propose("a", "x")
    net.heal()
    net.down.add("a")
    net.campaign("c")                   # b holds x, c does not: b refuses
    assert net["c"].state != LEADER
    net.campaign("b")
    assert net.leaders() == ["b"]


# ---- 5.4.2 Committing entries from previous terms -----------------------------------------------

def test_5_4_2_only_an_entry_of_the_current_term_is_committed_by_counting_replicas():
    # a leads term 3 with an entry of term 2 at index 3 that only it holds
    a = make("a", "abc", terms=[1, 2], term=2, commit=2)
    a.campaign()
    for p in "bc":
        a.step(Message(VOTE_RESP, p, "a", 3))
    assert a.state == LEADER and a.term == 3 and a.last_index == 4
    ready_msgs(a)
    # the followers acknowledge index 3 (term 2) before they have the term-3 entry at 4
    for p in "bc":
        a.step(Message(APP_RESP, p, "a", 3, index=3))
    assert a.progress["b"].match == 3 and a.commit == 2     # a majority holds 3: not enough
    a.step(Message(APP_RESP, "b", "a", 3, index=4))
    assert a.commit == 4                                    # 4 is of term 3: 3 goes with it


def test_5_4_2_figure_8_an_old_entry_on_a_majority_is_not_committed_until_the_leader_is():
    """The paper's Figure 8 (its index i is index i + 1 here: index 1 is the first snapshot).
    (c) s1 leads term 4; the entry of term 2 at index 3 reaches s2 and s3, a majority, before
    s1's own entry does: it is not committed, because (d) s5, whose index 3 has term 3, can
    still win term 5 (s2, s3 and s4 vote for it) and overwrite it. (e) Once s1's term-4 entry
    is on a majority, both are committed, and s5 can no longer win."""
    ids = ["s1", "s2", "s3", "s4", "s5"]
    s1 = make("s1", ids, terms=[1, 2], term=3, commit=2)
    s1.campaign()
    for p in ("s2", "s3"):
        s1.step(Message(VOTE_RESP, p, "s1", 4))
    assert s1.state == LEADER and s1.term == 4 and s1.log.term(4) == 4
    ready_msgs(s1)
    for p in ("s2", "s3"):                      # (c): they hold index 3 (term 2), not index 4
        s1.step(Message(APP_RESP, p, "s1", 4, index=3))
    assert s1.commit == 2
    # (d): s5 can win term 5 with the votes of s2, s3 (they hold 3/term 2) and s4
    s5 = make("s5", ids, terms=[1, 3], term=3)
    s5.campaign()
    (req,) = {m.type for m in ready_msgs(s5)}
    for p, terms in (("s2", [1, 2]), ("s3", [1, 2]), ("s4", [1])):
        voter = make(p, ids, terms=terms, term=4)
        voter.step(Message(VOTE, "s5", p, s5.term, log_term=3, index=3))
        (resp,) = ready_msgs(voter)
        assert not resp.reject
        s5.step(resp)
    assert s5.state == LEADER and s5.log.term(3) == 3       # index 3 of term 2 is gone there
    # (e): once s1's own entry is on a majority, index 3 is committed with it ...
    for p in ("s2", "s3"):
        s1.step(Message(APP_RESP, p, "s1", 4, index=4))
    assert s1.commit == 4
    # ... and s5 can no longer win: a voter that holds index 4 (term 4) refuses it
    voter = make("s2", ids, terms=[1, 2, 4], term=4)
    voter.step(Message(VOTE, "s5", "s2", 5, log_term=3, index=3))
    (resp,) = ready_msgs(voter)
    assert resp.reject


# ---- pre-vote and check-quorum (dissertation 9.6, 6.2) ------------------------------------------

def test_pre_vote_a_partitioned_member_does_not_disrupt_a_healthy_leader():
    net = Net("abc", pre_vote=True, check_quorum=True)
    net.campaign("a")
    assert net.leaders() == ["a"]
    net.isolate("c")
    for _ in range(5 * ET):
        net.tick_all()
    assert net["c"].term == 1 and net["c"].state == PRE_CANDIDATE    # it never raised its term
    net.heal()
    net.tick_all(3)
    assert net.leaders() == ["a"] and all(net[i].term == 1 for i in "abc")
    assert net["c"].leader == "a"


def test_pre_vote_without_it_a_partitioned_member_deposes_the_leader_on_return():
    net = Net("abc")
    net.campaign("a")
    net.isolate("c")
    for _ in range(5 * ET):
        net.tick("c")
    assert net["c"].term > 1
    net.heal()
    net.tick_all(2 * ET)
    assert net["a"].term > 1            # what pre-vote prevents


def test_pre_vote_a_pre_candidate_keeps_its_term_and_vote_until_it_wins():
    r = make("a", "abc", term=4, vote="b", pre_vote=True)
    r.campaign()
    assert (r.state, r.term, r.vote) == (PRE_CANDIDATE, 4, "b")
    msgs = ready_msgs(r)
    assert [(m.type, m.term) for m in msgs] == [(PRE_VOTE, 5), (PRE_VOTE, 5)]
    r.step(Message(raft_module.PRE_VOTE_RESP, "b", "a", 5))
    assert (r.state, r.term, r.vote) == (CANDIDATE, 5, "a")


def test_check_quorum_a_leader_cut_off_from_a_majority_steps_down():
    net = Net("abc", pre_vote=True, check_quorum=True)
    net.campaign("a")
    net.isolate("a")
    for _ in range(2 * ET):
        net.tick("a")
    assert net["a"].state == FOLLOWER and net["a"].term == 1


def test_check_quorum_followers_that_hear_a_leader_ignore_a_disruptive_candidate():
    net = Net("abc", check_quorum=True)
    net.campaign("a")
    net.isolate("c")
    net.campaign("c")                   # no pre-vote: c raises its term
    net.heal()
    net["b"].step(Message(VOTE, "c", "b", net["c"].term, log_term=1, index=net["c"].last_index))
    assert net["b"].term == 1 and net["b"].vote == "a" and net["b"].leader == "a"
    assert ready_msgs(net["b"]) == []


def test_a_deposed_leader_never_commits_and_its_entries_are_replaced():
    net = Net("abcde")
    net.campaign("a")
    net.isolate("a")
    for k in range(3):
        net.propose("a", f"lost{k}")
    net.campaign("b")
    assert net["b"].state == LEADER and net["b"].term == 2
    index = net.propose("b", "kept")
    assert net["a"].state == LEADER and net["a"].commit < index     # still believes it leads
    net.heal()
    net.tick("b", 2)
    assert net["a"].state == FOLLOWER and net["a"].term == 2
    for i in "abcde":
        data = [d for _, _, d in net.applied[i]]
        assert "kept" in data and not any(str(d).startswith("lost") for d in data)
        assert [(e.index, e.term) for e in net[i].log.entries] == \
            [(e.index, e.term) for e in net["b"].log.entries]


# ---- log compaction (paper section 7) ----------------------------------------------------------

def test_7_a_lagging_follower_is_sent_a_snapshot_and_catches_up():
    net = Net("abc")
    net.campaign("a")
    net.isolate("c")
    for k in range(10):
        net.propose("a", f"x{k}")
    a = net["a"]
    snap = a.compact(a.log.applied, tuple(net.sm["a"]))
    assert a.log.snap_index == snap.index > net["c"].last_index
    net.propose("a", "after")
    net.heal()
    net.tick("a", 3)
    assert any(m.type == SNAP and m.to == "c" for m in net.sent)
    c = net["c"]
    assert c.log.snap_index >= snap.index and c.commit == a.commit
    assert net.sm["c"] == net.sm["a"]       # the snapshot's data, then the entries after it
    assert [(e.index, e.term) for e in c.log.entries] == \
        [(e.index, e.term) for e in a.log.entries if e.index > c.log.snap_index]


def test_7_a_snapshot_older_than_the_commit_index_is_answered_not_installed():
    r = make("b", "abc", terms=[1, 1, 1], term=1, commit=4)
    r.step(Message(SNAP, "a", "b", 1, snapshot=Snapshot(3, 1, ("a", "b", "c"), (), ())))
    (resp,) = ready_msgs(r)
    assert (resp.type, resp.index, resp.reject) == (APP_RESP, 4, False)
    assert r.log.snap_index == 1 and r.last_index == 4


def test_7_a_snapshot_replaces_a_log_that_does_not_hold_its_last_entry():
    r = make("b", "abc", terms=[1, 2, 2], term=3, commit=2)
    snap = Snapshot(5, 3, ("a", "b", "c"), (), ((2, 1, NORMAL, "x"),))
    r.step(Message(SNAP, "a", "b", 3, snapshot=snap))
    rd = r.ready()
    assert rd.snapshot is snap and rd.entries == []
    assert (r.log.snap_index, r.last_index, r.commit) == (5, 5, 5)
    assert [(m.type, m.index) for m in rd.messages] == [(APP_RESP, 5)]


def test_7_a_member_that_joins_empty_is_sent_a_snapshot_first():
    net = Net("ab")
    net.campaign("a")
    net.propose("a", "x")
    sm: list = []
    net.add("c", Raft("c", (), election_ticks=ET, rng=random.Random(3),
                      snapshot_source=lambda: tuple(sm)), sm)
    assert net["a"].propose_conf(ADD_LEARNER, "c") is not None
    net.pump("a")
    net.run()
    net.tick("a", 3)
    c = net["c"]
    assert c.log.snap_index > 0 and c.learners == {"c"} and c.voters == {"a", "b"}
    assert c.commit == net["a"].commit
    assert [x[3] for x in net.sm["c"]] == [x[3] for x in net.sm["a"]]


def test_a_member_made_again_empty_is_caught_up_after_a_late_ack_of_its_old_self():
    """A member removed, then added back under its id (membership.py), starts empty; an
    acknowledgement its old self sent before the removal may still arrive after the re-add
    (the stream simulator, seed 5515). The leader then believes it matches an index it does
    not hold; its probes are rejected with an empty log's hint (0), and the leader starts it
    over (a snapshot) instead of taking each rejection as stale."""
    def fresh(sm):
        return Raft("c", (), election_ticks=ET, heartbeat_ticks=1, rng=random.Random(3),
                    snapshot_source=lambda: tuple(sm))

    net = Net("ab")
    net.campaign("a")
    sm: list = []
    net.add("c", fresh(sm), sm)
    net["a"].propose_conf(ADD_LEARNER, "c")
    net.pump("a")
    net.run()
    net.tick("a", 3)
    for k in range(3):
        net.propose("a", f"x{k}")
    old_ack = max((m for m in net.sent if m.type == APP_RESP and m.frm == "c"
                   and not m.reject), key=lambda m: m.index)
    assert old_ack.index == net["a"].log.last_index
    net["a"].propose_conf(REMOVE, "c")
    net.pump("a")
    net.run()
    assert "c" not in net["a"].progress
    sm = []
    net.add("c", fresh(sm), sm)            # made again, empty, under its id
    net.isolate("c")
    net["a"].propose_conf(ADD_LEARNER, "c")
    net.pump("a")
    net.run()
    assert net["a"].progress["c"].match == 0
    net["a"].step(Message.from_wire(old_ack.to_wire()))     # its old self's, arriving late
    net.pump("a")
    assert net["a"].progress["c"].match == old_ack.index
    net.heal()
    net.tick_all(5)
    c = net["c"]
    assert c.learners == {"c"} and c.commit == net["a"].commit
    assert [x[3] for x in net.sm["c"]] == [x[3] for x in net.sm["a"]]


# ---- learners ---------------------------------------------------------------------------------

def test_a_learner_does_not_vote_campaign_or_count_toward_a_commit():
    net = Net("abc", learners=("c",))
    assert not net["c"].promotable()
    for _ in range(3 * ET):
        net.tick("c")
    assert net["c"].state == FOLLOWER and net["c"].term == 0
    net.campaign("a")
    assert net.leaders() == ["a"]
    assert not any(m.type == VOTE and m.to == "c" for m in net.sent)
    net.down.add("b")
    index = net.propose("a", "x")
    net.tick("a", 3)
    assert net["c"].last_index >= index            # c has it ...
    assert net["a"].commit < index                 # ... and it does not count


def test_a_promoted_learner_counts():
    net = Net("abc", learners=("c",))
    net.campaign("a")
    net.propose("a", "x")
    assert net["a"].propose_conf(ADD_VOTER, "c") is not None
    net.pump("a")
    net.run()
    net.tick("a", 2)
    assert net["a"].voters == {"a", "b", "c"} and net["c"].promotable()
    net.down.add("b")
    index = net.propose("a", "y")
    assert net["a"].commit == index


def test_one_membership_change_at_a_time():
    net = Net("abc")
    net.campaign("a")
    a = net["a"]
    assert a.propose_conf(REMOVE, "a") is None                 # not the leader itself
    net.down.add("c")
    net.cut |= {("a", "b")}
    first = a.propose_conf(ADD_LEARNER, "d")
    assert first is not None and a.propose_conf(ADD_LEARNER, "e") is None
    net.cut.clear()
    net.pump("a")
    net.tick("a", 2)
    assert "d" in a.learners and a.propose_conf(ADD_LEARNER, "e") is not None


# ---- peer_lost: a closed link starts an election at once ---------------------------------------

def test_peer_lost_a_follower_whose_leader_died_campaigns_after_its_delay():
    net = Net("abc", pre_vote=True, check_quorum=True)
    net.campaign("a")
    net.tick_all(2)
    net.down.add("a")
    net["b"].peer_lost("a", 1)
    net["c"].peer_lost("a", 2)
    net.tick_all(1)
    assert net.leaders() == ["b"]       # one tick, not an election timeout (10 to 19 ticks)
    assert net["b"].term == 2 and net["c"].leader == "b"


def test_peer_lost_without_it_the_followers_wait_out_the_election_timeout():
    net = Net("abc", pre_vote=True, check_quorum=True)
    net.campaign("a")
    net.tick_all(2)
    net.down.add("a")
    net.tick_all(ET - 1)
    assert net.leaders() == []


def test_peer_lost_of_a_live_leader_does_not_depose_it():
    net = Net("abc", pre_vote=True, check_quorum=True)
    net.campaign("a")
    net.tick_all(2)
    net["b"].peer_lost("a", 1)          # b's link flapped; c still hears a
    net.tick("b", 2)
    assert net.leaders() == ["a"] and net["a"].term == 1


@pytest.mark.parametrize("pre_vote,check_quorum", [(False, False), (False, True),
                                                   (True, False), (True, True)])
def test_peer_lost_of_a_leader_heard_again_restores_the_election_timeout(pre_vote,
                                                                         check_quorum):
    """Regression: the short timeout peer_lost sets stayed after the leader was heard again (a
    link that flapped), so two lost heartbeats, far less than an election timeout, deposed a
    healthy leader (every combination but pre-vote with check-quorum)."""
    net = Net("abc", pre_vote=pre_vote, check_quorum=check_quorum)
    net.campaign("a")
    net.tick_all(2)
    net["b"].peer_lost("a", 2)
    net.tick_all(5)                     # b hears a again
    assert net["b"].leader == "a" and net["b"].randomized_timeout >= ET
    net.cut.add(("a", "b"))             # two heartbeats lost
    net.tick_all(2)
    net.cut.clear()
    net.tick_all(5)
    assert net.leaders() == ["a"] and [net[i].term for i in "abc"] == [1, 1, 1]


def test_peer_lost_on_a_leader_counts_the_peer_inactive():
    net = Net("abc", pre_vote=True, check_quorum=True)
    net.campaign("a")
    net.tick_all(2)
    net["a"].peer_lost("b")
    net["a"].peer_lost("c")
    assert not net["a"].progress["b"].recent_active
    net.down |= {"b", "c"}
    net.tick("a", ET)
    assert net["a"].state == FOLLOWER


# ---- leadership transfer (etcd's MsgTimeoutNow; dissertation 3.10) --------------------------

@pytest.mark.parametrize("ids", ["abc", "abcde"])
def test_a_leadership_transfer_elects_the_target_at_once(ids):
    """The target campaigns without pre-vote and its peers grant the vote inside the old
    leader's lease (check-quorum would otherwise make them ignore it)."""
    net = Net(ids, pre_vote=True, check_quorum=True)
    net.campaign("a")
    net.tick_all(2)
    assert net["a"].transfer_leadership("b")
    assert net["a"].propose("x") is None        # no proposal while it hands over
    net.pump("a")
    net.run()
    assert net.leaders() == ["b"] and net["b"].term == 2


def test_a_transfer_to_a_lagging_target_waits_for_its_log():
    net = Net("abc", pre_vote=True, check_quorum=True)
    net.campaign("a")
    net.down.add("b")
    net.propose("a", "x")
    net.down.discard("b")
    assert net["a"].transfer_leadership("b")
    net.pump("a")
    net.run()
    assert net.leaders() == ["b"]
    assert [e.data for e in net["b"].log.entries if e.data is not None][-1] == "x"


# ---- membership repair (membership.py) ---------------------------------------------------------

def test_repair_brings_a_wiped_member_back_under_its_new_id():
    """Regression: with the default ``wanted_nodes`` the stale id used to be removed first, and
    then the node was no longer wanted: its new id was never added (the simulator's liveness
    check found it)."""
    a, b, c0, c1 = (membership.member_id(n, d) for n, d in
                    (("a", "d0"), ("b", "d0"), ("c", "d0"), ("c", "d1")))
    net = Net([a, b, c0])
    net.campaign(a)
    net.propose(a, "x")
    net.down.add(c0)                            # c's disk is wiped: it comes back as c1
    sm: list = []
    net.add(c1, Raft(c1, (), election_ticks=ET, rng=random.Random(1),
                     snapshot_source=lambda: tuple(sm)), sm)
    current = {"a": a, "b": b, "c": c1}
    changes = []
    for _ in range(10):
        change = membership.repair(net[a], current)
        if change is None:
            break
        changes.append(change)
        assert net[a].propose_conf(*change) is not None
        net.pump(a)
        net.run()
        net.tick(a, 2)
    assert changes == [(ADD_LEARNER, c1), (REMOVE, c0), (ADD_VOTER, c1)]
    assert net[a].voters == {a, b, c1} and not net[a].learners
    assert net[c1].voters == {a, b, c1} and net[c1].promotable()
    net.down.add(b)
    index = net.propose(a, "y")
    assert net[a].commit == index               # c1 counts


def test_repair_removes_an_unwanted_member_and_promotes_only_a_caught_up_learner():
    net = Net(["a@1", "b@1", "c@1"], learners=("c@1",))
    net.campaign("a@1")
    net.down.add("c@1")
    net.propose("a@1", "x")
    current = {"a": "a@1", "b": "b@1", "c": "c@1"}
    assert membership.repair(net["a@1"], current) is None       # c is behind: not promoted
    assert membership.repair(net["a@1"], current, {"a", "b"}) == (REMOVE, "c@1")
    net.down.clear()
    net.tick("a@1", 2)
    assert membership.repair(net["a@1"], current) == (ADD_VOTER, "c@1")


def test_repair_proposes_nothing_while_a_change_is_pending_or_when_not_leader():
    net = Net(["a@1", "b@1", "c@1"])
    current = {"a": "a@1", "b": "b@1", "c": "c@2"}
    assert membership.repair(net["a@1"], current) is None
    net.campaign("a@1")
    net.down.add("b@1")
    net.cut |= {("a@1", "c@1")}
    assert net["a@1"].propose_conf(ADD_LEARNER, "c@2") is not None
    assert membership.repair(net["a@1"], current) is None


# ---- messages on the wire -----------------------------------------------------------------------

def test_messages_survive_the_wire_format():
    m = Message(SNAP, "a", "b", 3, 2, 9, [Entry(2, 10, CONF, [ADD_LEARNER, "c"])], 8, True, 4,
                Snapshot(9, 2, ("a", "b"), ("c",), [[2, 1, 0, "x"]]))
    w = raft_module.Message.from_wire(m.to_wire())
    assert w == m
    with pytest.raises((ValueError, TypeError)):
        Message.from_wire([99, "a", "b", 1, 0, 0, [], 0, False, 0, None, False])
    with pytest.raises((ValueError, TypeError)):
        Message.from_wire([SNAP, "a", "b", 1])             # too short
    assert "heartbeat_resp" in repr(Message(HEARTBEAT_RESP, "a", "b", 1))
