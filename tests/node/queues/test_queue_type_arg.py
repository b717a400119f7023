"""``x-queue-type`` (node/queues/args.py): classic and quorum are accepted (quorum as a classic
queue until replication lands); stream and any other type are refused with RabbitMQ 3.10's 406
for a type the broker does not have (docs/queues.md, "Queue types")."""
from __future__ import annotations

import pytest

from shoal.shared.errors import PRECONDITION_FAILED, AMQPError
from shoal.node.queues.args import QueueType, parse_queue_arguments


@pytest.mark.parametrize("qtype", ["classic", "quorum", b"classic"])
def test_classic_and_quorum_give_a_plain_queue(qtype):
    cfg = parse_queue_arguments("/", "jobs", {"x-queue-type": qtype})
    assert cfg.type is QueueType.STANDARD and cfg.plain


@pytest.mark.parametrize("qtype", ["foo", b"foo", "lazy"])
def test_unknown_types_are_refused_in_rabbitmqs_words(qtype):
    with pytest.raises(AMQPError) as e:
        parse_queue_arguments("/", "events", {"x-queue-type": qtype})
    name = qtype.decode() if isinstance(qtype, bytes) else qtype
    assert e.value.reply_code == PRECONDITION_FAILED and e.value.soft
    # RabbitMQ 3.10.8, x-queue-type foo: the same text with its own type name
    assert e.value.text == (f"invalid arg 'x-queue-type' for queue 'events' in vhost '/': "
                            f"\"unsupported queue type '{name}'\"")


def test_the_classic_parser_never_makes_a_stream():
    """A stream's declare goes to node/streams/ (queue_requests.py); were one to reach the
    classic queue's parser, it would be refused, never turned into a classic queue."""
    with pytest.raises(AMQPError) as e:
        parse_queue_arguments("/v", "s", {"x-queue-type": "stream", "x-max-length-bytes": 10})
    assert "unsupported queue type 'stream'" in e.value.text and "in vhost '/v'" in e.value.text


def test_a_stream_queue_from_an_older_journal_is_restored_as_the_classic_queue_it_was():
    cfg = parse_queue_arguments("/", "old", {"x-queue-type": "stream"}, restored=True)
    assert cfg.type is QueueType.STANDARD and cfg.plain
    with pytest.raises(AMQPError):
        parse_queue_arguments("/", "old", {"x-queue-type": "foo"}, restored=True)
