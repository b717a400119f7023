"""The real node process: ZeroMQ ROUTER socket or unix:// listener, garbage resistance, clean
SIGTERM."""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import msgpack
import zmq

from shoal.node.cli import main as cli_main
from shoal.node.intake import feed_frame
from shoal.node.process import run_node
from shoal.node.server import NodeServer
from shoal.node.shard import Shard
from shoal.shared import stream
from shoal.shared.settings import Settings
from shoal.shared.wire import WIRE_VERSION, T, decode_batch, encode_batch


def test_feed_frame_survives_garbage():
    shard = Shard("node-0", "inc")
    assert feed_frame(shard, b"r", b"\xc1\xff garbage", 0) == 0
    assert feed_frame(shard, b"r", msgpack.packb({"a": 1}), 0) == 0
    # decodable but nonsense messages: each is dropped, the good one still runs
    frame = encode_batch([[None], [T.CREDIT, [1], 2, 3], [T.HELLO, WIRE_VERSION, "r", "node-0"],
                          [T.SETTLE, 1, [[1, 2]]], [T.PUBLISH, 0, "/", 5, "", "", b"", b""]])
    feed_frame(shard, b"r", frame, 0)
    out = shard.take_outbox()
    # CREDIT before HELLO: GOODBYE (unknown peer); bad SETTLE and PUBLISH: dropped
    assert out == {b"r": [[T.GOODBYE], [T.HELLO_OK, WIRE_VERSION, "node-0", "inc"]]}
    assert b"r" in shard.peers


def dealer(ctx: zmq.Context, endpoint: str) -> zmq.Socket:
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.RCVTIMEO, 5000)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(endpoint)
    return s


def recv_until(sock: zmq.Socket, tag: T) -> list:
    while True:
        for msg in decode_batch(sock.recv()):
            if msg[0] == tag:
                return msg


@contextlib.contextmanager
def node_in_thread(tmp_path):
    """A node serving ``ipc://`` in a thread, and a router's DEALER socket to it: yields
    ``(server, thread, exit codes, socket)``; the node is stopped and joined after."""
    endpoint = f"ipc://{tmp_path}/node.sock"
    settings = Settings(node_id="node-0", node_bind=endpoint, data_dir=str(tmp_path / "data"))
    server = NodeServer(settings)
    codes: list[int] = []
    t = threading.Thread(target=lambda: codes.append(run_node(settings, server)))
    t.start()
    ctx = zmq.Context()
    try:
        s = dealer(ctx, endpoint)
        yield server, t, codes, s
        s.close()
    finally:
        server.stop()
        t.join(10)
        ctx.term()


def test_node_in_thread_batches_and_stops(tmp_path):
    with node_in_thread(tmp_path) as (server, t, codes, s):
        s.send(encode_batch([[T.HELLO, WIRE_VERSION, "r1", "node-0"],
                             [T.QUEUE_DECLARE, 1, "/", "q", False, False, False, False, {},
                              None],
                             [T.PUBLISH, 7, "/", ["q"], "", "q", b"h", b"body", None]]))
        batch = decode_batch(s.recv())
        tags = [m[0] for m in batch]
        assert tags[:4] == [T.HELLO_OK, T.TOPOLOGY_EVENT, T.REPLY, T.PUBLISH_RESULT]  # one batch
        server.stop()
        t.join(10)
        assert not t.is_alive() and codes == [0]
        assert recv_until(s, T.GOODBYE) == [T.GOODBYE]


def test_a_turns_answers_to_consecutive_publishes_leave_as_one_run(tmp_path):
    """Three confirmed publishes in one batch: the node's batch back answers them with one
    PUBLISH_RESULT for ids 7-9 (shared/wire.py ``coalesce_results``); one to a queue that
    does not exist (routed 0) is a run of its own."""
    with node_in_thread(tmp_path) as (server, t, codes, s):
        s.send(encode_batch([[T.HELLO, WIRE_VERSION, "r1", "node-0"],
                             [T.QUEUE_DECLARE, 1, "/", "q", False, False, False, False, {},
                              None]]))
        recv_until(s, T.REPLY)
        s.send(encode_batch([[T.PUBLISH, seq, "/", ["q"], "", "q", b"h", b"body", None]
                             for seq in (7, 8, 9)]
                            + [[T.PUBLISH, 10, "/", ["gone"], "", "gone", b"h", b"x", None]]))
        answers = [m for m in decode_batch(s.recv()) if m[0] == T.PUBLISH_RESULT]
        assert answers == [[T.PUBLISH_RESULT, 7, 0, 1, 3], [T.PUBLISH_RESULT, 10, 0, 0]]


def test_a_clean_stop_marks_the_journal_and_the_next_start_takes_the_mark(tmp_path):
    """node/durability/group_commit.py: a stop whose last commit succeeded leaves
    journal/CLEAN; the next start removes it (so a crash from then on counts as unclean); a
    server closed without serving leaves none."""
    settings = Settings(node_id="node-0", node_bind=f"ipc://{tmp_path}/node.sock",
                        data_dir=str(tmp_path / "data"))
    marker = tmp_path / "data" / "journal" / "CLEAN"
    server = NodeServer(settings)
    t = threading.Thread(target=run_node, args=(settings, server))
    t.start()
    server.stop()
    t.join(10)
    assert not t.is_alive() and server.journal is None and marker.exists()
    again = NodeServer(settings)
    again.open_journal()
    assert not marker.exists() and again.journal is not None
    again.close()
    assert again.journal is None and not marker.exists()


def test_node_process_hello_garbage_sigterm(tmp_path):
    endpoint = f"ipc://{tmp_path}/node.sock"
    proc = subprocess.Popen([sys.executable, "-m", "shoal.node", "--node-id", "node-3",
                             "--bind", endpoint, "--data-dir", str(tmp_path)],
                            stderr=subprocess.PIPE, text=True)
    ctx = zmq.Context()
    try:
        line = proc.stderr.readline()
        assert f"shoal node node-3 listening on {endpoint}" in line
        s = dealer(ctx, endpoint)
        s.send(b"\x00\x01not msgpack at all")
        s.send(encode_batch([[T.HELLO, WIRE_VERSION, "r1", "node-3"]]))
        hello_ok = recv_until(s, T.HELLO_OK)
        assert hello_ok[:3] == [T.HELLO_OK, WIRE_VERSION, "node-3"]
        s.send(encode_batch([["junk"], [T.CREDIT]]))
        s.send(encode_batch([[T.TOPOLOGY_SNAPSHOT, 5]]))
        assert recv_until(s, T.REPLY) == [T.REPLY, 5, 0, "", [[], [], [], []]]
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
        assert recv_until(s, T.GOODBYE) == [T.GOODBYE]
        s.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()
        ctx.term()


def test_cli_bad_config_exits_2(capsys):
    assert cli_main(["--bind", "nonsense"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "node_bind" in err


def _frames_until(sock: socket.socket, reader: stream.FrameReader, tag: T) -> list:
    while True:
        data = sock.recv(65536)
        assert data, "the node closed the connection"
        for frame in reader.feed(data):
            for msg in decode_batch(frame):
                if msg[0] == tag:
                    return msg


def test_node_process_on_a_unix_socket_hello_garbage_sigterm(tmp_path):
    path = f"{tmp_path}/node.sock"
    proc = subprocess.Popen([sys.executable, "-m", "shoal.node", "--node-id", "node-3",
                             "--bind", f"unix://{path}", "--data-dir", str(tmp_path)],
                            stderr=subprocess.PIPE, text=True)
    try:
        assert f"shoal node node-3 listening on unix://{path}" in proc.stderr.readline()
        # a second node on a live node's path stops with one line and exit 1
        second = subprocess.run([sys.executable, "-m", "shoal.node", "--node-id", "node-4",
                                 "--bind", f"unix://{path}", "--data-dir", f"{tmp_path}/b"],
                                capture_output=True, text=True, timeout=30)
        assert second.returncode == 1
        assert "cannot bind" in second.stderr and "already listens" in second.stderr
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(5)
        s.connect(path)
        reader = stream.FrameReader()
        s.sendall(b"".join(stream.encode_frames([[T.HELLO, WIRE_VERSION, "r1", "node-3"]])))
        assert _frames_until(s, reader, T.HELLO_OK)[:3] == [T.HELLO_OK, WIRE_VERSION, "node-3"]
        s.sendall(b"\x00\x00\x00\x05junk!")          # a frame that is not msgpack: dropped
        s.sendall(b"".join(stream.encode_frames([[T.TOPOLOGY_SNAPSHOT, 5]])))
        assert _frames_until(s, reader, T.REPLY) == [T.REPLY, 5, 0, "", [[], [], [], []]]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
        assert _frames_until(s, reader, T.GOODBYE) == [T.GOODBYE]
        s.close()
        assert not os.path.exists(path)                  # the node removed its socket file
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()


def test_a_router_whose_connection_closed_is_forgotten_before_any_heartbeat(tmp_path):
    """Issue 43 point 3: ZeroMQ's monitor says a connection closed but not whose; the node
    probes its routers (node/server.py ``_unreachable_routers``) and forgets the one that is
    gone, so a message it held unacknowledged goes to another router's consumer, flagged
    redelivered. Heartbeats here come every 5 s and silence counts after 60 s: the release
    within the 10 s bound below is the probe's."""
    endpoint = f"ipc://{tmp_path}/node.sock"
    settings = Settings(node_id="node-0", node_bind=endpoint, data_dir=str(tmp_path / "data"),
                        link_heartbeat_ms=5000, link_heartbeat_timeout=60)
    server = NodeServer(settings)
    t = threading.Thread(target=run_node, args=(settings, server))
    t.start()
    ctx = zmq.Context()
    try:
        a, b = dealer(ctx, endpoint), dealer(ctx, endpoint)
        a.send(encode_batch([[T.HELLO, WIRE_VERSION, "ra", "node-0"],
                             [T.QUEUE_DECLARE, 1, "/", "q", False, True, False, False, {}, None],
                             [T.PUBLISH, 7, "/", ["q"], "", "q", b"h", b"body", None],
                             [T.CONSUME, 2, 1, "/", "q", "ta", False, False, {}, "ra/c"],
                             [T.CREDIT, 1, 10, False]]))
        first = recv_until(a, T.DELIVER)
        assert first[7] == b"body" and first[3] is False
        b.send(encode_batch([[T.HELLO, WIRE_VERSION, "rb", "node-0"],
                             [T.CONSUME, 1, 1, "/", "q", "tb", False, False, {}, "rb/c"],
                             [T.CREDIT, 1, 10, False]]))
        recv_until(b, T.REPLY)
        a.close()                       # router A's connection closes (as on kill -9)
        deadline = time.monotonic() + 10
        again = None
        while again is None and b.poll(max(0, int((deadline - time.monotonic()) * 1000))):
            again = next((m for m in decode_batch(b.recv()) if m[0] == T.DELIVER), None)
        assert again is not None, "the message was not released within 10 s"
        assert again[7] == b"body" and again[3] is True
    finally:
        server.stop()
        t.join(10)
        ctx.destroy(linger=0)
