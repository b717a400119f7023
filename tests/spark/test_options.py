"""Option checking of the ``shoal`` data source without Spark (issue 21): an unknown or
misspelled option fails with one line that names it, suggests the near miss and lists the valid
options; names stay case-insensitive; the keys Spark adds to a ``writeStream`` are accepted; the
sink publishes with ``mandatory`` unless told otherwise."""
from __future__ import annotations

import pytest
from shoal.pipeline.spark.options import ShoalSparkError, SinkOptions, SourceOptions

URL = "amqp://guest:guest@127.0.0.1:5672/%2F"


def _sink_error(options: dict, streaming: bool = False) -> str:
    with pytest.raises(ShoalSparkError) as info:
        SinkOptions.parse(options, streaming=streaming)
    message = str(info.value)
    assert "\n" not in message
    return message


def _source_error(options: dict) -> str:
    with pytest.raises(ShoalSparkError) as info:
        SourceOptions.parse(options)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_sink_names_a_misspelled_option_and_the_right_one():
    # Spark lowercases option names before the data source sees them
    message = _sink_error({"url": URL, "routing_key": "q"})
    assert "'routing_key'" in message
    assert "did you mean 'routingKey'?" in message
    assert 'df.write.format("shoal")' in message
    assert "valid options: url, exchange, routingKey, mandatory, deliveryMode" in message


def test_source_names_a_misspelled_option_and_the_right_one():
    message = _source_error({"url": URL, "queue": "q", "maxmessagesperbach": "10"})
    assert "'maxmessagesperbach'" in message
    assert "did you mean 'maxMessagesPerBatch'?" in message
    assert 'spark.readStream.format("shoal")' in message
    assert ("valid options: url, queue, multiqueue, prefetch, maxMessagesPerBatch, "
            "pollTimeoutMs") in message


def test_every_unknown_option_is_named_in_one_line():
    message = _source_error({"url": URL, "queues": "q", "colour": "blue"})
    assert "unknown options 'colour', 'queues' (did you mean 'queue'?)" in message


def test_unknown_names_are_checked_before_required_ones():
    assert "did you mean 'url'?" in _source_error({"uri": URL, "queue": "q"})
    assert "did you mean 'url'?" in _sink_error({"uri": URL})


def test_option_names_are_case_insensitive():
    sink = SinkOptions.parse({"URL": URL, "ROUTINGKEY": "q", "Mandatory": "false"})
    assert (sink.url, sink.routing_key, sink.mandatory) == (URL, "q", False)
    source = SourceOptions.parse({"Url": URL, "QUEUE": "q", "maxMessagesPerBatch": "7"})
    assert (source.queue, source.max_messages_per_batch) == ("q", 7)


def test_stream_sink_accepts_the_keys_spark_adds_and_batch_sink_does_not():
    options = {"url": URL, "routingkey": "q", "checkpointlocation": "/tmp/ck",
               "queryname": "events"}
    assert SinkOptions.parse(options, streaming=True).routing_key == "q"
    message = _sink_error(options)
    assert "'checkpointlocation'" in message and "'queryname'" in message
    assert "plus Spark's checkpointLocation and queryName" in _sink_error(
        {"url": URL, "routing_key": "q"}, streaming=True)


def test_a_path_is_refused_with_its_own_explanation():
    assert "shoal takes no path" in _sink_error({"url": URL, "path": "/tmp/out"})
    assert "shoal takes no path" in _source_error({"url": URL, "queue": "q", "path": "q"})


def test_sink_is_mandatory_unless_told_otherwise():
    assert SinkOptions.parse({"url": URL}).mandatory is True
    assert SinkOptions.parse({"url": URL, "mandatory": "false"}).mandatory is False
    assert "is not true or false" in _sink_error({"url": URL, "mandatory": "maybe"})
