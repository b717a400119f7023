"""Prometheus metrics (issue 23, point 3; router/management/metrics.py): a real cluster is
scraped over HTTP and the text is parsed with prometheus-client's own parser; RabbitMQ's
metric names carry what pika did, Shoal's own carry the nodes' figures."""
from __future__ import annotations

import json
import re
import time
import urllib.request
from pathlib import Path

import pika
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import stop_cluster
from tests.e2e.management.test_management import http_cluster

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def prom(tmp_path_factory):
    c = http_cluster(tmp_path_factory.mktemp("shoal-prom"), prom_port="SHOAL_PROMETHEUS_PORT")
    yield c
    stop_cluster(c)


def scrape(cl, path: str = "/metrics") -> dict[str, list]:
    """metric family name -> its samples, as prometheus-client parses them."""
    with urllib.request.urlopen(f"http://127.0.0.1:{cl.prom_port}{path}", timeout=10) as r:
        assert r.headers["Content-Type"].startswith("text/plain")
        text = r.read().decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def value(samples: list, suffix: str = "", **labels) -> float:
    found = [s.value for s in samples if s.name.endswith(suffix)
             and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(found) == 1, (suffix, labels, samples)
    return found[0]


def test_queue_gauges_counters_and_node_figures(prom, uid):
    q = f"prom-{uid}"
    conn = pika.BlockingConnection(pika.URLParameters(prom.url))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare(q, durable=True)
    before = scrape(prom)
    for i in range(5):
        ch.basic_publish("", q, b"m%d" % i, pika.BasicProperties(delivery_mode=2))
    ch.basic_publish("", f"nowhere-{uid}", b"lost")
    ch.basic_qos(prefetch_count=2)
    got = []
    ch.basic_consume(q, lambda c, m, p, b: got.append(m.delivery_tag))
    while len(got) < 2:
        conn.process_data_events(time_limit=0.2)
    ch.basic_ack(got[0])
    while len(got) < 3:                   # prefetch 2: the ack lets a third one come
        conn.process_data_events(time_limit=0.2)

    per = scrape(prom, "/metrics/per-object")
    node = prom.owner(q)
    assert value(per["rabbitmq_queue_messages_ready"], vhost="/", queue=q, node=node) == 2
    assert value(per["rabbitmq_queue_messages_unacked"], vhost="/", queue=q, node=node) == 2
    assert value(per["rabbitmq_queue_messages"], vhost="/", queue=q) == 4
    assert value(per["rabbitmq_queue_consumers"], vhost="/", queue=q) == 1

    after = scrape(prom)
    assert "rabbitmq_queue_messages_ready" in after and all(
        not s.labels for s in after["rabbitmq_queue_messages_ready"])      # totals only
    assert value(after["rabbitmq_connections"]) >= 1
    assert value(after["rabbitmq_channels"]) >= 1

    def grew(name: str) -> float:
        return value(after[name], "_total") - value(before[name], "_total")
    assert grew("rabbitmq_global_messages_received") == 6
    assert grew("rabbitmq_global_messages_routed") == 5
    assert grew("rabbitmq_global_messages_unroutable_dropped") == 1
    assert grew("rabbitmq_global_messages_confirmed") == 6
    assert grew("rabbitmq_global_messages_acknowledged") == 1
    assert grew("rabbitmq_global_messages_delivered_consume_manual_ack") == 3

    for n in ("node-0", "node-1"):
        assert value(after["shoal_node_up"], node=n) == 1
        assert value(after["rabbitmq_process_resident_memory_bytes"], node=n) > 0
        assert value(after["shoal_link_round_trip_seconds"], node=n) >= 0
    fsync = after["shoal_journal_fsync_seconds"]
    assert value(fsync, "_count", node=node) >= 1             # the persistent publishes
    assert value(fsync, "_bucket", node=node, le="+Inf") == value(fsync, "_count", node=node)
    assert value(after["shoal_journal_group_commit_records"], "_sum", node=node) >= 5
    conn.close()


def test_the_charts_dashboard_uses_only_metrics_shoal_serves(prom):
    """Every metric the Grafana dashboard (helm/shoal/dashboards/) queries is in a scrape
    (a histogram's _bucket/_sum/_count and a counter's _total are its samples)."""
    board = json.loads((Path(__file__).resolve().parents[3] / "helm" / "shoal" / "dashboards"
                        / "shoal-overview.json").read_text())
    used = {name for p in board["panels"] for t in p["targets"]
            for name in re.findall(r"\b((?:rabbitmq|shoal)_[a-z_]+)\b", t["expr"])}
    served = {s.name for samples in scrape(prom).values() for s in samples}
    assert used and used <= served, used - served


def test_stream_consumer_offset_lag(prom, uid):
    """A stream consumer that has read 2 of 5 messages lags by 3: RabbitMQ's highest-lag
    gauge, and per consumer on /metrics/per-object (docs/streams.md). It may read from a
    member that does not lead, which reports it to the leader within a second
    (node/streams/readers.py): the scrape is asked again until then."""
    q = f"prom-stream-{uid}"
    conn = pika.BlockingConnection(pika.URLParameters(prom.url))
    ch = conn.channel()
    ch.queue_declare(q, durable=True, arguments={"x-queue-type": "stream"})
    ch.confirm_delivery()
    for i in range(5):
        ch.basic_publish("", q, b"m%d" % i)
    ch.basic_qos(prefetch_count=2)
    got = []
    ch.basic_consume(q, lambda c, m, p, b: got.append(m), consumer_tag="lagging",
                     arguments={"x-stream-offset": "first"})
    while len(got) < 2:
        conn.process_data_events(time_limit=0.1)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not any(
            smp.labels.get("queue") == q for smp in
            scrape(prom, "/metrics/per-object").get("shoal_stream_consumer_offset_lag", [])):
        conn.process_data_events(time_limit=0.2)
    assert value(scrape(prom)["rabbitmq_stream_consumer_max_offset_lag"]) >= 3
    per = scrape(prom, "/metrics/per-object")
    assert value(per["rabbitmq_stream_consumer_max_offset_lag"], queue=q) == 3
    assert value(per["shoal_stream_consumer_offset_lag"], queue=q, consumer_tag="lagging") == 3
    ch.queue_delete(q)
    conn.close()
