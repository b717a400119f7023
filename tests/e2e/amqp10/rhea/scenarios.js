// AMQP 1.0 scenarios with Node's rhea (tests/e2e/amqp10/test_rhea.py runs them against Shoal):
// `node scenarios.js CONFIG_JSON` prints one JSON object {scenario: result}. CONFIG_JSON holds
// host, port, user, password, and the names the Python side declared with pika:
// queue, exchange_queue + exchange + key, release_queue, reject_queue + dlq, request_queue,
// missing (a queue that does not exist). Each scenario is bounded by TIMEOUT_MS; one that
// overruns gives ["timeout", what it was waiting for].
'use strict';
const rhea = require('rhea');

const cfg = JSON.parse(process.argv[2]);
const TIMEOUT_MS = 10000;

function connect(container, extra) {
  const conn = container.connect(Object.assign({
    host: cfg.host, port: cfg.port, username: cfg.user, password: cfg.password,
    reconnect: false, idle_time_out: 30000,
  }, extra || {}));
  conn.on('error', () => {});
  conn.on('connection_error', () => {});
  return conn;
}

// A data section body (a 0-9-1 consumer sees the bytes as they are).
const data = (s) => rhea.message.data_section(Buffer.from(s));

function text(body) {
  if (Buffer.isBuffer(body)) return body.toString();
  if (body && body.content !== undefined) return Buffer.from(body.content).toString();
  return String(body);
}

// Resolves with what `fn(resolve, reject)` resolves with, or ["timeout", label].
function bounded(label, fn) {
  return new Promise((resolve) => {
    const t = setTimeout(() => resolve(['timeout', label]), TIMEOUT_MS);
    Promise.resolve().then(() => new Promise(fn)).then(
      (v) => { clearTimeout(t); resolve(v); },
      (e) => { clearTimeout(t); resolve(['error', String(e && (e.condition || e.message) || e)]); });
  });
}

function close(conn) {
  return new Promise((resolve) => {
    if (!conn.is_open()) { resolve(); return; }
    const t = setTimeout(resolve, 2000);
    conn.once('connection_close', () => { clearTimeout(t); resolve(); });
    conn.once('disconnected', () => { clearTimeout(t); resolve(); });
    conn.close();
  });
}

// Send `bodies` unsettled to `address`; resolves with the outcomes in order.
function sendAll(conn, address, messages) {
  return new Promise((resolve, reject) => {
    const sender = conn.open_sender({ target: { address }, name: 'snd-' + Math.random() });
    const outcomes = [];
    let sent = false;
    const done = () => { if (outcomes.length === messages.length) { sender.close(); resolve(outcomes); } };
    sender.on('sendable', () => {
      if (sent) return;
      sent = true;
      for (const m of messages) sender.send(m);
    });
    sender.on('accepted', () => { outcomes.push('accepted'); done(); });
    sender.on('released', () => { outcomes.push('released'); done(); });
    sender.on('rejected', () => { outcomes.push('rejected'); done(); });
    sender.on('sender_error', (ctx) => reject(ctx.sender.error || new Error('sender_error')));
  });
}

// Receive `n` messages from `address`, settling each with `settle(delivery)`; resolves with
// their bodies (as text) and closes the link.
function receiveN(conn, address, n, settle) {
  return new Promise((resolve, reject) => {
    const receiver = conn.open_receiver({
      source: { address }, autoaccept: false, credit_window: 0, name: 'rcv-' + Math.random(),
    });
    const got = [];
    receiver.add_credit(n);
    receiver.on('message', (ctx) => {
      got.push(text(ctx.message.body));
      settle(ctx.delivery);
      if (got.length === n) { receiver.close(); resolve(got); }
    });
    receiver.on('receiver_error', (ctx) => reject(ctx.receiver.error || new Error('receiver_error')));
  });
}

const scenarios = {
  async queue_send_receive(container) {
    const conn = connect(container);
    try {
      const sent = await sendAll(conn, `/queues/${cfg.queue}`, [
        { body: data('a') }, { body: data('b') }, { body: data('c') }]);
      const got = await receiveN(conn, `/queues/${cfg.queue}`, 3, (d) => d.accept());
      return [sent, got];
    } finally { await close(conn); }
  },

  async exchange_address(container) {
    const conn = connect(container);
    try {
      const sent = await sendAll(conn, `/exchanges/${cfg.exchange}/${cfg.key}`,
        [{ body: data('routed'), application_properties: { colour: 'red' } }]);
      const got = await receiveN(conn, `/queues/${cfg.exchange_queue}`, 1, (d) => d.accept());
      return [sent, got];
    } finally { await close(conn); }
  },

  async release_then_accept(container) {
    const conn = connect(container);
    try {
      await sendAll(conn, `/queues/${cfg.release_queue}`, [{ body: data('again') }]);
      const first = await receiveN(conn, `/queues/${cfg.release_queue}`, 1, (d) => d.release());
      const second = await receiveN(conn, `/queues/${cfg.release_queue}`, 1, (d) => d.accept());
      return [first, second];
    } finally { await close(conn); }
  },

  async reject_dead_letters(container) {
    const conn = connect(container);
    try {
      await sendAll(conn, `/queues/${cfg.reject_queue}`, [{ body: data('bad') }]);
      const rejected = await receiveN(conn, `/queues/${cfg.reject_queue}`, 1, (d) => d.reject());
      const dead = await receiveN(conn, `/queues/${cfg.dlq}`, 1, (d) => d.accept());
      return [rejected, dead];
    } finally { await close(conn); }
  },

  async dynamic_request_reply(container) {
    const client = connect(container);
    const server = connect(container);
    try {
      // the server answers each request to its reply_to, on an anonymous (null target) link
      const relay = server.open_sender({ target: {}, name: 'relay-' + Math.random() });
      const requests = server.open_receiver({ source: { address: `/queues/${cfg.request_queue}` } });
      requests.on('message', (ctx) => {
        relay.send({ to: ctx.message.reply_to, correlation_id: ctx.message.correlation_id,
                     body: data('pong:' + text(ctx.message.body)) });
      });
      const replyTo = await new Promise((resolve, reject) => {
        const replies = client.open_receiver({ source: { dynamic: true }, name: 'dyn-' + Math.random() });
        replies.on('receiver_open', (ctx) => resolve([ctx.receiver.source.address, replies]));
        replies.on('receiver_error', (ctx) => reject(ctx.receiver.error || new Error('receiver_error')));
      });
      const [address, replies] = replyTo;
      const answer = new Promise((resolve) => {
        replies.on('message', (ctx) => resolve([text(ctx.message.body), ctx.message.correlation_id]));
      });
      await sendAll(client, `/queues/${cfg.request_queue}`,
        [{ body: data('ping'), reply_to: address, correlation_id: 'c-1' }]);
      const [body, corr] = await answer;
      return [typeof address === 'string' && address.length > 0, body, corr];
    } finally { await close(client); await close(server); }
  },

  // Every section and type a 1.0 publisher sends comes back to a 1.0 consumer (issue 45:
  // messages kept whole): the received message's fields, with each value's AMQP type.
  async whole_round_trip(container) {
    const conn = connect(container);
    const t = rhea.types;
    try {
      await sendAll(conn, `/queues/${cfg.queue}`, [{
        body: { k: [1, 'two'] }, subject: 'subj', to: `/queues/${cfg.queue}`, group_id: 'g',
        reply_to_group_id: 'rg', group_sequence: 3, message_id: 'm-1', content_type: 'text/plain',
        user_id: Buffer.from(cfg.user), creation_time: new Date(1700000000123),
        message_annotations: { 'x-opt-u': t.wrap_ulong(9), 'x-opt-s': t.wrap_symbol('s') },
        application_properties: {
          ubyte: t.wrap_ubyte(200), ushort: t.wrap_ushort(60000), uint: t.wrap_uint(4000000000),
          byte: t.wrap_byte(-100), short: t.wrap_short(-30000), int: t.wrap_int(-5),
          long: t.wrap_long(-2), float: t.wrap_float(1.5), double: t.wrap_double(2.25),
          bool: true, str: 'text', sym: t.wrap_symbol('sym'), bin: t.wrap_binary(Buffer.from([0, 255])),
          ts: t.wrap_timestamp(1700000000123), nul: null,
        },
        footer: { sig: t.wrap_binary(Buffer.from([1, 2])) },
      }]);
      const got = await new Promise((resolve, reject) => {
        const r = conn.open_receiver({ source: { address: `/queues/${cfg.queue}` }, autoaccept: true });
        r.on('message', (ctx) => { r.close(); resolve(ctx.message); });
        r.on('receiver_error', (ctx) => reject(ctx.receiver.error || new Error('receiver_error')));
      });
      const typed = {};
      const raw = got.application_properties || {};
      for (const k of Object.keys(raw)) {
        const v = raw[k];
        typed[k] = Buffer.isBuffer(v) ? ['binary', [...v]]
          : (v instanceof Date ? ['timestamp', v.getTime()] : v);
      }
      return {
        body: got.body, subject: got.subject, to: got.to, group_id: got.group_id,
        reply_to_group_id: got.reply_to_group_id, group_sequence: got.group_sequence,
        message_id: got.message_id, content_type: got.content_type,
        user_id: got.user_id ? Buffer.from(got.user_id).toString() : null,
        creation_time: got.creation_time ? new Date(got.creation_time).getTime() : null,
        annotations: got.message_annotations, properties: typed,
        footer: got.footer ? Object.keys(got.footer) : null,
      };
    } finally { await close(conn); }
  },

  // RabbitMQ 4's management node over a link pair to /management (HTTP over AMQP 1.0):
  // declare a queue, read it, purge it, delete it; the replies' status codes.
  async management_node(container) {
    const conn = connect(container, { hostname: 'vhost:/' });
    try {
      const name = 'mgmt-' + Math.random();
      const pairProps = { paired: true };
      const sender = conn.open_sender({ name, target: { address: '/management' },
        source: { address: '/management' }, snd_settle_mode: 1, properties: pairProps });
      // rhea keeps a session's links by name: the second half is opened once the first is
      // attached (as RabbitMQ's JavaScript client does)
      await new Promise((resolve) => sender.once('sender_open', resolve));
      const receiver = conn.open_receiver({ name, source: { address: '/management' },
        target: { address: '/management' }, snd_settle_mode: 1, properties: pairProps,
        autoaccept: false });
      await new Promise((resolve) => receiver.once('receiver_open', resolve));
      const replies = [];
      receiver.on('message', (ctx) => { const w = replies.shift(); if (w) w(ctx.message); });
      const ask = (subject, to, body) => new Promise((resolve) => {
        replies.push(resolve);
        sender.send({ message_id: 'r-' + Math.random(), to, subject, reply_to: '$me', body });
      });
      const path = `/queues/${encodeURIComponent(cfg.mgmt_queue)}`;
      const put = await ask('PUT', path, { durable: true, exclusive: false, auto_delete: false,
        arguments: { 'x-queue-type': 'quorum' } });
      const get = await ask('GET', path, null);
      const purge = await ask('DELETE', path + '/messages', null);
      const del = await ask('DELETE', path, null);
      const missing = await ask('GET', path, null);
      // the flags as rhea reads them: RabbitMQ 4 writes {boolean, B} (0x56), which rhea
      // decodes as 1 or 0 (RabbitMQ's JavaScript client compares with 1)
      return [put.subject, get.subject, get.body && get.body.type, purge.subject, del.subject,
              missing.subject, get.body && [get.body.durable, get.body.exclusive,
                                            get.body.auto_delete]];
    } finally { await close(conn); }
  },

  async missing_queue(container) {
    const conn = connect(container);
    try {
      return await new Promise((resolve) => {
        const r = conn.open_receiver({ source: { address: `/queues/${cfg.missing}` } });
        r.on('receiver_error', (ctx) => resolve(['link', ctx.receiver.error && ctx.receiver.error.condition]));
        conn.on('session_error', (ctx) => resolve(['session', ctx.session.error && ctx.session.error.condition]));
      });
    } finally { await close(conn); }
  },

  async wrong_password(container) {
    const conn = connect(container, { password: 'not-the-password' });
    return new Promise((resolve) => {
      conn.on('connection_open', () => resolve('opened'));
      conn.on('disconnected', (ctx) => resolve(['disconnected',
        (ctx.error && (ctx.error.condition || ctx.error.message)) || null]));
    });
  },
};

async function main() {
  const names = process.argv.slice(3);
  const out = {};
  for (const name of Object.keys(scenarios)) {
    if (names.length && !names.includes(name)) continue;
    const container = rhea.create_container({ id: 'rhea-' + name });
    out[name] = await bounded(name, (resolve, reject) => scenarios[name](container).then(resolve, reject));
  }
  process.stdout.write(JSON.stringify(out) + '\n');
  process.exit(0);
}

main();
