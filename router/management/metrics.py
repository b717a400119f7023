"""Prometheus metrics on ``prometheus_port`` (15692, RabbitMQ's ``rabbitmq_prometheus`` port;
issue 23, point 3), rendered with prometheus-client in its text format.

Two paths, as RabbitMQ's plugin has them:

- ``/metrics``: the cluster's totals (``rabbitmq_queue_messages_ready`` and the other queue
  gauges summed over every queue, no queue label) plus this router's own figures;
- ``/metrics/per-object``: the same with one sample per queue (labels ``vhost``, ``queue``,
  ``node``).

Queue figures come from every node (wire QUEUE_LIST), node figures from NODE_STATS (resident
memory, event-loop lag, the journal's fsync latency and group-commit size histograms, paging),
each within 5 s; a node that does not answer is left out and ``shoal_node_up`` is 0 for it. The
figures of connections, channels, consumers and the ``rabbitmq_global_*`` counters are this
router process's (a scrape of each router pod; with several routers on one host the port is
shared, so a scrape reaches one of them). Names follow RabbitMQ where it has one; Shoal's own
start with ``shoal_``.
"""
from __future__ import annotations

import asyncio
import time

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily,
                                    HistogramMetricFamily)

from shoal.router.amqp.handshake import shoal_version
from shoal.router.broker import Broker
from shoal.router.management.views import RABBITMQ_VERSION, node_stats, queue_rows

#: RabbitMQ's global counters (``rabbitmq_global_messages_*_total``) -> Broker.stats keys
GLOBAL_COUNTERS = {
    "received": ("rabbitmq_global_messages_received", "Messages received from publishers"),
    "routed": ("rabbitmq_global_messages_routed", "Messages routed to queues"),
    "unroutable": ("rabbitmq_global_messages_unroutable_dropped",
                   "Messages published that no queue took"),
    "returned": ("rabbitmq_global_messages_unroutable_returned",
                 "Mandatory messages no queue took, returned to the publisher"),
    "confirmed": ("rabbitmq_global_messages_confirmed", "Messages confirmed to publishers"),
    "delivered": ("rabbitmq_global_messages_delivered_consume_manual_ack",
                  "Messages delivered to consumers"),
    "acknowledged": ("rabbitmq_global_messages_acknowledged",
                     "Messages acknowledged by consumers"),
}


class RouterLag:
    """This router's event-loop lag (seconds): how late a callback due each second ran."""

    def __init__(self) -> None:
        self.last = 0.0
        self.max = 0.0
        self.task: asyncio.Task | None = None

    async def run(self) -> None:
        while True:
            due = time.monotonic() + 1.0
            await asyncio.sleep(1.0)
            self.last = max(0.0, time.monotonic() - due)
            self.max = max(self.max, self.last)


def _histogram(name: str, doc: str, wire: list, labels: dict) -> HistogramMetricFamily:
    bounds, counts, total, _count = wire
    h = HistogramMetricFamily(name, doc, labels=list(labels))
    cumulative, buckets = 0, []
    for bound, n in zip(list(bounds) + ["+Inf"], counts):
        cumulative += n
        buckets.append((str(float(bound)) if bound != "+Inf" else "+Inf", cumulative))
    h.add_metric(list(labels.values()), buckets, total)
    return h


class Snapshot:
    """A prometheus-client collector over figures gathered once per scrape."""

    def __init__(self, families: list) -> None:
        self.families = families

    def collect(self):
        return iter(self.families)


async def families(broker: Broker, lag: RouterLag, per_object: bool) -> list:
    """Every metric family of one scrape."""
    (rows, _missing), stats = await asyncio.gather(queue_rows(broker, None),
                                                   node_stats(broker))
    out: list = []
    info = GaugeMetricFamily("rabbitmq_identity_info", "Shoal's identity (RabbitMQ's name)",
                             labels=["rabbitmq_node", "rabbitmq_cluster", "shoal_router"])
    info.add_metric([broker.router_id, "shoal", broker.router_id], 1)
    build = GaugeMetricFamily("rabbitmq_build_info", "Version information",
                              labels=["rabbitmq_version", "product_name", "product_version"])
    build.add_metric([RABBITMQ_VERSION, "Shoal", shoal_version()], 1)
    out += [info, build]
    labels = ["vhost", "queue", "node"] if per_object else []
    gauges = {k: GaugeMetricFamily(f"rabbitmq_queue_{k}", doc, labels=labels) for k, doc in (
        ("messages_ready", "Messages ready to be delivered to consumers"),
        ("messages_unacked", "Messages delivered to consumers but not yet acknowledged"),
        ("messages", "Messages ready and unacknowledged"),
        ("consumers", "Consumers on a queue"))}
    fields = {"messages_ready": "messages_ready", "messages_unacked": "messages_unacknowledged",
              "messages": "messages", "consumers": "consumers"}
    for key, fam in gauges.items():
        if per_object:
            for r in rows:
                fam.add_metric([r["vhost"], r["name"], r["node"]], r[fields[key]])
        else:
            fam.add_metric([], sum(r[fields[key]] for r in rows))
    out += list(gauges.values())
    out += stream_families(rows, per_object)
    out.append(GaugeMetricFamily("rabbitmq_queues", "Queues available", value=len(rows)))
    channels = sum(len(c.channels) for c in broker.connections)
    for name, doc, value in (
            ("rabbitmq_connections", "Connections currently open (this router)",
             len(broker.connections)),
            ("rabbitmq_channels", "Channels currently open (this router)", channels),
            ("rabbitmq_consumers", "Consumers currently connected (this router)",
             len(broker.consumers))):
        out.append(GaugeMetricFamily(name, doc, value=value))
    for key, (name, doc) in GLOBAL_COUNTERS.items():
        out.append(CounterMetricFamily(name, doc + " (this router)", value=broker.stats[key]))
    out.append(CounterMetricFamily("shoal_publishers_paused", "Times publishing connections "
                                   "were paused because a node link was full (node not "
                                   "keeping up)", value=broker.stats["publishers_paused"]))
    out.append(CounterMetricFamily("shoal_deliveries_leased", "Deliveries this router made "
                                   "itself under a queue's delivery lease, without the hop to "
                                   "its node (docs/consumers.md)", value=broker.stats["leased"]))
    out.append(GaugeMetricFamily("shoal_router_event_loop_lag_seconds", "How late this "
                                 "router's event loop ran a callback due each second",
                                 value=lag.last))
    up = GaugeMetricFamily("shoal_node_up", "1 if the node answered this scrape",
                           labels=["node"])
    rtt = GaugeMetricFamily("shoal_link_round_trip_seconds", "Round trip of a request from "
                            "this router to the node", labels=["node"])
    depth = GaugeMetricFamily("shoal_link_queue_depth", "Wire messages waiting in this "
                              "router's link to the node", labels=["node"])
    rss = GaugeMetricFamily("rabbitmq_process_resident_memory_bytes", "Resident memory of "
                            "the node process", labels=["node"])
    lag_n = GaugeMetricFamily("shoal_node_event_loop_lag_seconds", "How late the node's "
                              "event loop ran a callback due each second", labels=["node"])
    paged = GaugeMetricFamily("shoal_node_paged_bytes", "Message bodies in the node's page "
                              "files", labels=["node"])
    hists = []
    for node_id, (st, seconds) in stats.items():
        link = broker.links[node_id]
        depth.add_metric([node_id], link.queue_depth)
        up.add_metric([node_id], 1 if st is not None else 0)
        if st is None:
            continue
        rtt.add_metric([node_id], seconds)
        rss.add_metric([node_id], st.get("rss_bytes", 0))
        lag_n.add_metric([node_id], st.get("loop_lag_seconds", 0.0))
        paged.add_metric([node_id], st.get("paged_bytes", 0))
        if "fsync_seconds" in st:
            hists.append(_histogram("shoal_journal_fsync_seconds", "Latency of the journal's "
                                    "fdatasync per group commit", st["fsync_seconds"],
                                    {"node": node_id}))
            hists.append(_histogram("shoal_journal_group_commit_records", "Records written "
                                    "per group commit", st["commit_records"],
                                    {"node": node_id}))
    out += [up, rtt, depth, rss, lag_n, paged, *raft_families(stats)]
    # one family per name: merge the nodes' samples
    merged: dict[str, HistogramMetricFamily] = {}
    for h in hists:
        if h.name in merged:
            merged[h.name].samples.extend(h.samples)
        else:
            merged[h.name] = h
    return out + list(merged.values())


def stream_families(rows: list[dict], per_object: bool) -> list:
    """Streams' consumer offset lag (docs/streams.md): RabbitMQ's
    ``rabbitmq_stream_consumer_max_offset_lag`` (the highest of all, or per stream with
    ``per_object``), and with ``per_object`` each consumer's own,
    ``shoal_stream_consumer_offset_lag`` (committed messages it has not read)."""
    streams = [r for r in rows if r.get("type") == "stream"]
    labels = ["vhost", "queue", "node"] if per_object else []
    top = GaugeMetricFamily("rabbitmq_stream_consumer_max_offset_lag",
                            "Highest consumer offset lag", labels=labels)
    lags = {(r["vhost"], r["name"], r["node"]): [c[2] for c in r["stream_consumers"]]
            for r in streams}
    if per_object:
        for key, values in lags.items():
            top.add_metric(list(key), max(values, default=0))
        each = GaugeMetricFamily("shoal_stream_consumer_offset_lag", "Committed messages a "
                                 "stream consumer has not read",
                                 labels=["vhost", "queue", "consumer_tag"])
        for r in streams:
            for tag, _, lag, *_ in r["stream_consumers"]:
                each.add_metric([r["vhost"], r["name"], tag], lag)
        return [top, each]
    top.add_metric([], max((v for vs in lags.values() for v in vs), default=0))
    return [top]


#: RabbitMQ's Raft metrics (rabbitmq_prometheus, per quorum queue member) -> the index of the
#: figure in NODE_STATS' raft rows (node/replication/manager.py ``stats``)
RAFT_GAUGES = (
    ("rabbitmq_raft_term_total", "Current Raft term number", 3, CounterMetricFamily),
    ("rabbitmq_raft_log_commit_index", "Raft log commit index", 4, GaugeMetricFamily),
    ("rabbitmq_raft_log_last_applied_index", "Raft log last applied index", 5,
     GaugeMetricFamily),
    ("rabbitmq_raft_log_last_written_index", "Raft log last written index", 6,
     GaugeMetricFamily),
    ("rabbitmq_raft_log_snapshot_index", "Raft log snapshot index", 7, GaugeMetricFamily),
    ("shoal_raft_log_entries", "Raft log entries kept after the snapshot", 8,
     GaugeMetricFamily),
)


def raft_families(stats: dict) -> list:
    """Quorum queues' Raft figures: RabbitMQ's ``rabbitmq_raft_*`` per member (labels vhost,
    queue, node), each member's replication lag as its leader sees it, and the leader changes
    each node saw."""
    labels = ["vhost", "queue", "node"]
    fams = [(cls(name, doc, labels=labels), i) for name, doc, i, cls in RAFT_GAUGES]
    lag = GaugeMetricFamily("shoal_raft_member_lag_entries", "Log entries a quorum queue "
                            "member is behind its leader", labels=["vhost", "queue", "member"])
    changes = CounterMetricFamily("shoal_raft_leader_changes", "Quorum queue leaders this "
                                  "node saw elected", labels=["node"])
    for node_id, (st, _) in stats.items():
        raft = (st or {}).get("raft")
        if not raft:
            continue
        changes.add_metric([node_id], raft["leader_changes"])
        for row in raft["groups"]:
            for fam, i in fams:
                fam.add_metric([row[0], row[1], node_id], row[i])
            for member, behind in row[9].items():
                lag.add_metric([row[0], row[1], member], behind)
    return [f for f, _ in fams] + [lag, changes]


def make_app(broker: Broker) -> web.Application:
    lag = RouterLag()

    async def scrape(request: web.Request) -> web.Response:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(Snapshot(await families(broker, lag, request.path.endswith(
            "/per-object"))))
        return web.Response(body=generate_latest(registry),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def on_startup(app: web.Application) -> None:
        lag.task = asyncio.ensure_future(lag.run())

    async def on_cleanup(app: web.Application) -> None:
        if lag.task is not None:
            lag.task.cancel()

    app = web.Application()
    app.router.add_get("/metrics", scrape)
    app.router.add_get("/metrics/per-object", scrape)
    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app
