"""The self-contained HTML page of ``shoal report``: tables plus PNG plots (matplotlib, Agg
backend) embedded as ``data:image/png;base64`` URIs, so the file can be mailed or archived."""
from __future__ import annotations

import base64
import datetime as _dt
import html
import io

#: Columns shown in the HTML tables (the Parquet/CSV files hold every column).
RUN_COLUMNS = ("run", "broker", "producers", "consumers", "size", "sent", "received",
               "sent_per_s", "received_per_s", "peak_received_per_s", "latency_p50_ms",
               "latency_p95_ms", "latency_p99_ms", "latency_p999_ms", "redelivered", "lost",
               "duplicates", "nacked", "returned")
QUEUE_COLUMNS = ("run", "queue", "node", "sent", "received", "sent_per_s", "received_per_s",
                 "latency_p50_ms", "latency_p95_ms", "latency_p99_ms", "latency_p999_ms",
                 "redelivered", "lost")
NODE_COLUMNS = ("run", "node", "sent", "received", "sent_per_s", "received_per_s",
                "latency_p50_ms", "latency_p99_ms", "latency_p999_ms", "redelivered", "lost")


def _fmt(v) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:,.3f}" if abs(v) < 100 else f"{v:,.0f}"
    if isinstance(v, int):
        return f"{v:,}"
    return html.escape(str(v))


def _table(rows: list[dict], columns) -> str:
    cols = [c for c in columns if not rows or c in rows[0]]
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{_fmt(r.get(c))}</td>" for c in cols) + "</tr>"
                   for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    import matplotlib.pyplot as plt
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def plots(timeline: list[dict], hist: list[dict]) -> dict[str, str]:
    """PNG data URIs: ``throughput``, ``latency_over_time``, ``latency_distribution``."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    runs = sorted({r["run"] for r in timeline} | {r["run"] for r in hist})
    out = {}
    fig, ax = plt.subplots(figsize=(9, 3.6))
    for run in runs:
        pts = sorted((r["second"], r["sent"] or 0, r["received"] or 0)
                     for r in timeline if r["run"] == run and r["second"] is not None)
        if pts:
            s, sent, rec = zip(*pts)
            line, = ax.plot(s, rec, label=f"{run} received")
            ax.plot(s, sent, linestyle="--", color=line.get_color(), label=f"{run} sent")
    ax.set(xlabel="second since start", ylabel="messages / s", title="Throughput over time")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    out["throughput"] = _png(fig)

    fig, ax = plt.subplots(figsize=(9, 3.6))
    styles = {"p50": "-", "p99": "--", "p999": ":"}
    for run in runs:
        color = None
        for p, style in styles.items():
            pts = sorted((r["second"], r.get(f"latency_{p}_ms")) for r in timeline
                         if r["run"] == run and r.get(f"latency_{p}_ms") is not None)
            if pts:
                s, v = zip(*pts)
                line, = ax.plot(s, v, linestyle=style, color=color, label=f"{run} {p}")
                color = line.get_color()
    ax.set(xlabel="second since start (by receive time)", ylabel="latency (ms)",
           title="Consumer latency percentiles over time", yscale="log")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize="small")
    out["latency_over_time"] = _png(fig)

    fig, ax = plt.subplots(figsize=(9, 3.6))
    for run in runs:
        pts = sorted((r["latency_from_ms"], r["latency_to_ms"], r["count"]) for r in hist
                     if r["run"] == run)
        total = sum(p[2] for p in pts) or 1
        if pts:
            edges = [p[0] for p in pts] + [pts[-1][1]]
            ax.stairs([p[2] / total for p in pts], edges, label=run)
    ax.set(xscale="log", xlabel="latency (ms)", ylabel="fraction of samples",
           title="Consumer latency distribution")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize="small")
    out["latency_distribution"] = _png(fig)
    return out


CSS = """body{font-family:system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;font-size:13px;margin:0.5em 0 1.5em}
th,td{border:1px solid #ccc;padding:3px 7px;text-align:right}
th{background:#f0f0f0}td:first-child,th:first-child{text-align:left}
img{max-width:100%;display:block;margin:0.5em 0 1.5em}"""


def render(tables: dict[str, list[dict]], title: str = "Shoal load-test report") -> str:
    """The whole page. ``tables``: name -> list of row dicts (runs, queues, nodes, timeline,
    latency_hist)."""
    imgs = plots(tables["timeline"], tables["latency_hist"])
    now = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    parts = [(f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}"
              f"</title><style>{CSS}</style></head><body>"),
             (f"<h1>{html.escape(title)}</h1><p>Generated {now}. Throughput in messages/s over "
              "the sending window; latency in ms over the sampled deliveries received in the "
              "sending window; lost = sent but never received.</p>"),
             "<h2>Runs</h2>", _table(tables["runs"], RUN_COLUMNS),
             "<h2>Throughput over time</h2>",
             f"<img alt='throughput over time' src='{imgs['throughput']}'>",
             "<h2>Latency percentiles over time</h2>",
             f"<img alt='latency percentiles over time' src='{imgs['latency_over_time']}'>",
             "<h2>Latency distribution</h2>",
             f"<img alt='latency distribution' src='{imgs['latency_distribution']}'>",
             "<h2>Per queue</h2>", _table(tables["queues"], QUEUE_COLUMNS),
             "<h2>Per node</h2>", _table(tables["nodes"], NODE_COLUMNS),
             "</body></html>"]
    return "\n".join(parts)
