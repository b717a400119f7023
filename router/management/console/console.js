// Shoal's web console: a small page over the management API (docs/management.md), no build
// step. Credentials stay in sessionStorage and go with each request as HTTP basic auth.
"use strict";

const $ = (id) => document.getElementById(id);
let timer = null;
const rates = { points: [] };        // overview chart: [{t, publish, deliver}]

function auth() { return sessionStorage.getItem("shoal-auth"); }

async function api(method, path, body) {
  const opts = { method, headers: { Authorization: "Basic " + auth() } };
  if (body !== undefined) {
    opts.headers["Content-Type"] = "application/json";
    opts.body = JSON.stringify(body);
  }
  const resp = await fetch("api" + path, opts);
  const text = await resp.text();
  const data = text ? JSON.parse(text) : null;
  if (!resp.ok) {
    if (resp.status === 401) { logout(); }
    throw new Error((data && data.reason) || resp.statusText);
  }
  return data;
}

function esc(v) {
  return String(v === null || v === undefined ? "" : v).replace(/[&<>"']/g,
    (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
}

function enc(s) { return encodeURIComponent(s); }

function table(id, columns, rows, link) {
  const head = columns.map((c) => `<th>${esc(c[1])}</th>`).join("");
  const body = rows.map((r) => "<tr>" + columns.map((c, i) => {
    const v = typeof c[0] === "function" ? c[0](r) : r[c[0]];
    const cell = i === 0 && link ? `<a href="${link(r)}">${esc(v)}</a>` : esc(v);
    return `<td${typeof v === "number" ? ' class="num"' : ""}>${cell}</td>`;
  }).join("") + "</tr>").join("");
  return `<table id="${id}"><thead><tr>${head}</tr></thead><tbody>${body}</tbody></table>`;
}

function showError(e) { $("error").textContent = e ? String(e.message || e) : ""; }

// ---- pages ---------------------------------------------------------------------------------
async function overview() {
  const o = await api("GET", "/overview");
  const t = o.object_totals, q = o.queue_totals, m = o.message_stats || {};
  rates.points.push({ t: Date.now(), publish: (m.publish_details || {}).rate || 0,
                      deliver: (m.deliver_get_details || {}).rate || 0 });
  if (rates.points.length > 60) rates.points.shift();
  $("page").innerHTML = `<h2>Overview</h2>
    <div class="totals">
      <div>Ready <b id="total-ready">${q.messages_ready}</b></div>
      <div>Unacked <b id="total-unacked">${q.messages_unacknowledged}</b></div>
      <div>Queues <b>${t.queues}</b></div><div>Connections <b>${t.connections}</b></div>
      <div>Channels <b>${t.channels}</b></div><div>Consumers <b>${t.consumers}</b></div>
    </div>
    <h3>Message rates (msg/s): <span id="rate-publish">publish ${m.publish_details ?
      m.publish_details.rate : 0}</span>, <span id="rate-deliver">deliver ${
      m.deliver_get_details ? m.deliver_get_details.rate : 0}</span></h3>
    <canvas id="chart" width="640" height="160"></canvas>
    <p>${esc(o.product_name)} ${esc(o.product_version)} (RabbitMQ management API
      ${esc(o.management_version)}), ${esc(o.cluster_name)}</p>`;
  drawChart($("chart"));
}

function drawChart(canvas) {
  const g = canvas.getContext("2d"), pts = rates.points;
  const max = Math.max(1, ...pts.map((p) => Math.max(p.publish, p.deliver)));
  g.clearRect(0, 0, canvas.width, canvas.height);
  [["publish", "#1f77b4"], ["deliver", "#2ca02c"]].forEach(([key, colour]) => {
    g.strokeStyle = colour; g.beginPath();
    pts.forEach((p, i) => {
      const x = (i / 59) * canvas.width, y = canvas.height - (p[key] / max) * (canvas.height - 10);
      if (i === 0) g.moveTo(x, y); else g.lineTo(x, y);
    });
    g.stroke();
  });
  g.fillStyle = "#555"; g.fillText(`max ${max.toFixed(1)} msg/s`, 5, 12);
}

async function queues() {
  const rows = await api("GET", "/queues");
  $("page").innerHTML = `<h2>Queues</h2>
    ${table("queues", [["name", "Name"], ["vhost", "Vhost"], ["type", "Type"],
      ["node", "Node"], [(r) => (r.members || []).join(", "), "Members"],
      ["messages_ready", "Ready"], ["messages_unacknowledged", "Unacked"],
      ["consumers", "Consumers"]], rows,
      (r) => `#/queue/${enc(r.vhost)}/${enc(r.name)}`)}
    <h3>Add a queue</h3>
    <form class="inline" id="declare">
      <label>Name <input id="declare-name" required></label>
      <label>Vhost <input id="declare-vhost" value="/"></label>
      <label>Durable <select id="declare-durable"><option>true</option><option>false</option>
        </select></label>
      <button id="declare-submit" type="submit">Add queue</button>
    </form>`;
  $("declare").onsubmit = (ev) => act(ev, async () => {
    await api("PUT", `/queues/${enc($("declare-vhost").value)}/${enc($("declare-name").value)}`,
              { durable: $("declare-durable").value === "true", arguments: {} });
    await queues();
  });
}

async function queuePage(vhost, name) {
  const q = await api("GET", `/queues/${enc(vhost)}/${enc(name)}`);
  $("page").innerHTML = `<h2>Queue <span id="queue-name">${esc(name)}</span></h2>
    <p>Vhost ${esc(vhost)}, ${esc(q.type)} queue, ${q.type === "quorum"
      ? `leader <span id="queue-leader">${esc(q.leader || "none")}</span>, members
         <span id="queue-members">${esc((q.members || []).join(", "))}</span>, online
         ${esc((q.online || []).join(", "))}`
      : `node ${esc(q.node)}`}, ${q.durable ? "durable" : "transient"}</p>
    <div class="totals"><div>Ready <b id="queue-ready">${q.messages_ready}</b></div>
      <div>Unacked <b id="queue-unacked">${q.messages_unacknowledged}</b></div>
      <div>Consumers <b>${q.consumers}</b></div></div>
    <h3>Publish a message</h3>
    <form class="inline" id="publish">
      <label>Payload <textarea id="publish-payload" rows="2" cols="40"></textarea></label>
      <label>Delivery mode <select id="publish-mode"><option value="1">1 (transient)</option>
        <option value="2">2 (persistent)</option></select></label>
      <button id="publish-submit" type="submit">Publish message</button>
    </form>
    <h3>Get messages</h3>
    <form class="inline" id="get">
      <label>Ack mode <select id="get-ackmode">
        <option value="ack_requeue_true">Nack message requeue true</option>
        <option value="ack_requeue_false">Ack message requeue false</option>
        <option value="reject_requeue_false">Reject requeue false</option></select></label>
      <label>Messages <input id="get-count" type="number" value="1" min="1"></label>
      <button id="get-submit" type="submit">Get messages</button>
    </form>
    <div id="got"></div>
    <h3>Purge and delete</h3>
    <button id="purge" type="button">Purge messages</button>
    <button id="delete" type="button">Delete queue</button>`;
  const path = `/queues/${enc(vhost)}/${enc(name)}`;
  $("publish").onsubmit = (ev) => act(ev, async () => {
    const res = await api("POST", `/exchanges/${enc(vhost)}/amq.default/publish`, {
      routing_key: name, payload: $("publish-payload").value, payload_encoding: "string",
      properties: { delivery_mode: Number($("publish-mode").value) } });
    await queuePage(vhost, name);
    $("got").textContent = res.routed ? "Message published." : "Message published, but not routed.";
  });
  $("get").onsubmit = (ev) => act(ev, async () => {
    const msgs = await api("POST", path + "/get", { count: Number($("get-count").value),
      ackmode: $("get-ackmode").value, encoding: "auto", truncate: 50000 });
    await queuePage(vhost, name);
    $("got").innerHTML = msgs.length ? msgs.map((m, i) => `<h4>Message ${i + 1}</h4>
      <p>Exchange ${esc(m.exchange)}, routing key ${esc(m.routing_key)}, redelivered
      ${m.redelivered}, ${m.message_count} left, ${m.payload_bytes} bytes
      (${esc(m.payload_encoding)})</p><pre class="payload">${esc(m.payload)}</pre>`).join("")
      : "<p>Queue is empty</p>";
  });
  $("purge").onclick = (ev) => act(ev, async () => {
    await api("DELETE", path + "/contents"); await queuePage(vhost, name);
  });
  $("delete").onclick = (ev) => act(ev, async () => {
    await api("DELETE", path); location.hash = "#/queues";
  });
}

async function connections() {
  const [conns, chans] = await Promise.all([api("GET", "/connections"),
                                            api("GET", "/channels")]);
  $("page").innerHTML = `<h2>Connections</h2>
    ${table("connections", [["name", "Name"], ["user", "User"], ["vhost", "Vhost"],
      ["node", "Router"], ["channels", "Channels"], ["state", "State"]], conns)}
    <h2>Channels</h2>
    ${table("channels", [["name", "Channel"], ["user", "User"], ["prefetch_count", "Prefetch"],
      ["consumer_count", "Consumers"], ["messages_unacknowledged", "Unacked"]], chans)}`;
}

async function exchanges() {
  const [xs, bs] = await Promise.all([api("GET", "/exchanges"), api("GET", "/bindings")]);
  $("page").innerHTML = `<h2>Exchanges</h2>
    ${table("exchanges", [[(r) => r.name || "(AMQP default)", "Name"], ["vhost", "Vhost"],
      ["type", "Type"], ["durable", "Durable"]], xs)}
    <h2>Bindings</h2>
    ${table("bindings", [["source", "Source"], ["destination", "Destination"],
      ["destination_type", "Kind"], ["routing_key", "Routing key"]],
      bs.filter((b) => b.source !== ""))}`;   // not each queue's default-exchange binding
}

async function act(ev, fn) {
  ev.preventDefault();
  showError(null);
  try { await fn(); } catch (e) { showError(e); }
}

// ---- routing and login ---------------------------------------------------------------------
async function route() {
  clearInterval(timer);
  showError(null);
  if (!auth()) { $("login").hidden = false; $("nav").hidden = true; $("page").innerHTML = "";
                 return; }
  $("login").hidden = true; $("nav").hidden = false;
  const parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  document.querySelectorAll("nav a").forEach((a) => a.classList.toggle(
    "active", a.id === "nav-" + (parts[0] === "queue" ? "queues" : parts[0] || "overview")));
  try {
    if (parts[0] === "queues") { await queues(); timer = setInterval(() => queues().catch(showError), 5000); }
    else if (parts[0] === "queue") { await queuePage(parts[1], parts.slice(2).join("/")); }
    else if (parts[0] === "connections") { await connections(); }
    else if (parts[0] === "exchanges") { await exchanges(); }
    else { await overview(); timer = setInterval(() => overview().catch(showError), 2000); }
  } catch (e) { showError(e); }
}

function logout() { sessionStorage.removeItem("shoal-auth"); route(); }

$("login").onsubmit = async (ev) => {
  ev.preventDefault();
  const token = btoa(unescape(encodeURIComponent(
    $("login-user").value + ":" + $("login-password").value)));
  sessionStorage.setItem("shoal-auth", token);
  try {
    const me = await api("GET", "/whoami");
    $("who").textContent = me.name;
    $("login-error").textContent = "";
    route();
  } catch (e) {
    sessionStorage.removeItem("shoal-auth");
    $("login-error").textContent = "Login failed: " + e.message;
  }
};
$("logout").onclick = logout;
window.addEventListener("hashchange", route);
route();
