"""The real node process: ZeroMQ ROUTER socket, garbage resistance, clean SIGTERM."""
from __future__ import annotations

import signal
import subprocess
import sys
import threading

import msgpack
import zmq

from shoal.node.cli import main as cli_main
from shoal.node.process import run_node
from shoal.node.server import NodeServer, feed_frame
from shoal.node.shard import Shard
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


def test_node_in_thread_batches_and_stops(tmp_path):
    endpoint = f"ipc://{tmp_path}/node.sock"
    settings = Settings(node_id="node-0", node_bind=endpoint, data_dir=str(tmp_path / "data"))
    server = NodeServer(settings)
    codes: list[int] = []
    t = threading.Thread(target=lambda: codes.append(run_node(settings, server)))
    t.start()
    ctx = zmq.Context()
    try:
        s = dealer(ctx, endpoint)
        s.send(encode_batch([[T.HELLO, WIRE_VERSION, "r1", "node-0"],
                             [T.QUEUE_DECLARE, 1, "/", "q", False, False, False, False, {},
                              None],
                             [T.PUBLISH, 7, "/", ["q"], "", "q", b"h", b"body", None]]))
        batch = decode_batch(s.recv())
        tags = [m[0] for m in batch]
        assert tags[:3] == [T.HELLO_OK, T.REPLY, T.PUBLISH_RESULT]   # one send, one batch
        server.stop()
        t.join(10)
        assert not t.is_alive() and codes == [0]
        assert recv_until(s, T.GOODBYE) == [T.GOODBYE]
        s.close()
    finally:
        server.stop()
        t.join(10)
        ctx.term()


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
        assert recv_until(s, T.REPLY) == [T.REPLY, 5, 0, "", [[], []]]
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
