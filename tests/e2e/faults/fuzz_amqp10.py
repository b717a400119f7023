"""The AMQP 1.0 fuzz campaign (issue 37): mutated AMQP 1.0 byte streams against Shoal's sans-IO
engine (``shoal.router.amqp10.engine.Engine``), in process, a million inputs by hand::

    python -m tests.e2e.faults.fuzz_amqp10 --inputs 1000000 [--seed 1] [--jobs 2]

(tests/e2e/faults/test_fuzz_amqp10.py runs a CI-sized campaign.)

Inputs. A corpus of valid client streams, recorded from python-qpid-proton's client engine
(SASL PLAIN or no SASL, open, begin, sending and receiving links, whole and split transfers,
settled and unsettled, flows with drain and echo, every outcome, detach, end, close) as it talks
to the engine in lockstep, plus hand-built frames from an encoder (fuzz_amqp10_inputs.py) that is
independent of Shoal's codec (odd but legal encodings: list32/map32/str32, described
descriptors by symbol, every performative field as null, a transfer with a 64 KiB payload,
arrays, heartbeats, deep nesting). An input is one corpus stream (or the stream's prefix up to
the open, with 3 to 12 spliced hand-built frames) with 0 to 4 mutations: a bit flip, a byte
set to a type constructor (0x40, 0x45, 0xa1, 0xb0, 0xc0, 0xd0, 0xe0, 0xf0 ...), random bytes
inserted, a span deleted or duplicated, a frame spliced in from elsewhere, a frame's size or
doff rewritten (small, off by a few, huge), a compound/array/binary length rewritten to a huge
value, a descriptor changed (unknown ulong, symbol), then one time in ten a truncation. It is fed
to a fresh engine in random chunks (1 octet to all of it), and the engine is driven as the
router drives it (router/frontend/amqp10_client.py): open answered, links accepted with credit,
messages settled accepted, messages sent on links the client receives on while they have
credit, then EOF.

Checks, per input:
- no exception escapes ``receive_data``/``data_to_send``/``tick`` or the engine's own methods
  the driver calls (``open``, ``accept_link``, ``give_credit``, ``settle_received``,
  ``send_message``, ``drained``, ``detach``);
- the time per input stays under ``HANG_S`` and the engine's buffered input and output under
  ``MAX_BUFFER`` octets (bounded memory);
- the output is whole frames, each decodable by proton's own decoder (``proton.Data``), and
  nothing follows a ``close``;
- when the engine reports a protocol error (``ConnectionClosed`` with an error), its last frame
  is a ``close`` whose error condition is one of ``CONDITIONS``; after that it stays silent.

A failure is printed with its seed, index and the input's octets in hex (reproduce with
``--replay HEX``).

This module is the campaign's loop (``in_process``) and its command line (``--jobs``: a pool
of processes, each its own seed). The inputs (encoder, hand-built frames, mutations) are in
fuzz_amqp10_inputs.py; the engine driven, the corpus recorded and the checks in
fuzz_amqp10_checks.py.
"""
from __future__ import annotations

import argparse
import random
import sys
import time

from . import fuzz_amqp10_checks
from .fuzz_amqp10_checks import Result, distinct, record_sessions, run_one
from .fuzz_amqp10_inputs import Generator


def in_process(n: int, seed: int = 0, check_every: int = 1) -> Result:
    """``n`` inputs from ``seed``, each into a fresh engine."""
    rnd = random.Random(seed)
    gen = Generator(record_sessions())
    res = Result()
    began = time.monotonic()
    for i in range(n):
        data = gen.generate(rnd)
        run_one(data, random.Random(rnd.random()), res, f"seed {seed} input {i}",
                check_output=i % check_every == 0)
    res.seconds = time.monotonic() - began
    return res


def _job(args: tuple[int, int, int]) -> Result:
    n, seed, check_every = args
    return in_process(n, seed, check_every)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.e2e.faults.fuzz_amqp10")
    p.add_argument("--inputs", type=int, default=1_000_000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--jobs", type=int, default=1, help="processes (each its own seed)")
    p.add_argument("--check-every", type=int, default=1,
                   help="decode the output of every Nth input (1 = all)")
    p.add_argument("--replay", default="", help="one input, in hex, to run and report")
    p.add_argument("--out", default="", help="write every distinct failure, in full, here")
    a = p.parse_args(argv)
    if a.replay:
        fuzz_amqp10_checks.TRACEBACKS = True
        res = Result()
        run_one(bytes.fromhex(a.replay), random.Random(0), res, "replay")
        print(res.line("replay"))
        for f in res.failures:
            print(f)
        return 1 if res.failed else 0
    if a.jobs > 1:
        import multiprocessing as mp
        per = a.inputs // a.jobs
        with mp.get_context("spawn").Pool(a.jobs) as pool:
            parts = pool.map(_job, [(per, a.seed * 1000 + j, a.check_every)
                                    for j in range(a.jobs)])
        res = Result()
        t0 = max(p_.seconds for p_ in parts)
        for part in parts:
            res.merge(part)
        res.seconds = t0
    else:
        res = in_process(a.inputs, a.seed, a.check_every)
    print(res.line(), flush=True)
    print("outcomes:", dict(res.outcomes.most_common()))
    print("error conditions sent:", dict(res.conditions.most_common()))
    # one line per distinct failure (type and place), with its first input
    seen = distinct(res.failures, res.kinds)
    for key, (count, f) in list(seen.items())[:30]:
        print(f"[{count}x] {f}")
    if a.out:
        with open(a.out, "w") as f:
            for key, (count, first) in seen.items():
                f.write(f"[{count}x] {first}\n\n")
    print("PASS" if not res.failed else f"FAIL ({len(seen)} distinct)")
    return 0 if not res.failed else 1


if __name__ == "__main__":
    sys.exit(main())
