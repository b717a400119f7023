// Conformance scenarios with Node's amqplib (tests/e2e/test_amqplib.py runs them against
// Shoal, and against RabbitMQ when one runs): `node scenarios.js URL` prints one JSON object,
// {scenario: [event, ...]}, where an event is what the client saw: "ok", a value, or
// ["channel-error"|"connection-error", reply code]. Generated names are not printed.
'use strict';
const amqp = require('amqplib');
const crypto = require('crypto');

const url = process.argv[2];
const uid = () => crypto.randomBytes(6).toString('hex');

// What an error tells a user: which side closed and the reply code.
function outcome(err) {
  if (err && err.code) {
    const side = /Connection closed/.test(err.message) ? 'connection-error' : 'channel-error';
    return [side, err.code];
  }
  return ['error', String(err && err.message)];
}

async function withConn(fn) {
  const conn = await amqp.connect(url);
  conn.on('error', () => {});
  try { return await fn(conn); } finally { try { await conn.close(); } catch (e) { /* closed */ } }
}

async function step(events, fn) {
  try { const v = await fn(); events.push(v === undefined ? 'ok' : v); } catch (e) { events.push(outcome(e)); }
}

async function channel(conn) {
  const ch = await conn.createChannel();
  ch.on('error', () => {});
  return ch;
}

const scenarios = {
  async unicode_and_reserved_names(ev) {
    await withConn(async (conn) => {
      for (const prefix of ['ünïcode-', 'q#*-']) {
        const ch = await channel(conn);
        const name = prefix + uid();
        await step(ev, async () => (await ch.assertQueue(name, { autoDelete: false })).queue === name);
        ch.sendToQueue(name, Buffer.from('hi'));
        await step(ev, async () => { for (;;) { const m = await ch.get(name, { noAck: true }); if (m) return m.content.toString(); } });
        await step(ev, async () => (await ch.deleteQueue(name)).messageCount);
      }
      const ch = await channel(conn);
      await step(ev, () => ch.assertQueue('amq.reserved-' + uid()));
    });
  },
  async passive_declare_and_get_empty(ev) {
    await withConn(async (conn) => {
      let ch = await channel(conn);
      await step(ev, () => ch.checkQueue('missing-' + uid()));
      ch = await channel(conn);
      const { queue } = await ch.assertQueue('', { exclusive: true });
      await step(ev, () => ch.get(queue));
      await step(ev, () => ch.checkExchange('missing-' + uid()));
    });
  },
  async exclusive_queue_from_another_connection(ev) {
    await withConn(async (owner) => {
      const { queue } = await (await channel(owner)).assertQueue('', { exclusive: true });
      await withConn(async (other) => {
        await step(ev, async () => (await channel(other)).checkQueue(queue));
        await step(ev, async () => (await channel(other)).consume(queue, () => {}));
      });
    });
  },
  async nack_multiple_and_requeue(ev) {
    await withConn(async (conn) => {
      const ch = await channel(conn);
      const { queue } = await ch.assertQueue('', { exclusive: true });
      for (const b of ['m1', 'm2', 'm3']) ch.sendToQueue(queue, Buffer.from(b));
      const got = [];
      while (got.length < 3) { const m = await ch.get(queue); if (m) got.push(m); }
      ch.nack(got[1], true, true);        // m1, m2 back; m3 still unacked
      const again = [];
      while (again.length < 2) { const m = await ch.get(queue, { noAck: true }); if (m) again.push([m.content.toString(), m.fields.redelivered]); }
      ev.push(again);
      ch.ack(got[2]);
      await step(ev, async () => (await ch.checkQueue(queue)).messageCount);
    });
  },
  async exchange_to_exchange_and_headers(ev) {
    await withConn(async (conn) => {
      const ch = await channel(conn);
      const src = 'e2e-src-' + uid(), dst = 'e2e-hdr-' + uid();
      await ch.assertExchange(src, 'fanout', { autoDelete: true });
      await ch.assertExchange(dst, 'headers', { autoDelete: true });
      await step(ev, () => ch.bindExchange(dst, src, ''));
      const { queue } = await ch.assertQueue('', { exclusive: true });
      await ch.bindQueue(queue, dst, '', { 'x-match': 'any', a: 1, b: 'x' });
      ch.publish(src, '', Buffer.from('match-b'), { headers: { b: 'x' } });
      ch.publish(src, '', Buffer.from('no-match'), { headers: { c: 1 } });
      ch.publish(src, '', Buffer.from('match-a'), { headers: { a: 1 } });
      await ch.checkQueue(queue);   // a round trip: the publishes are routed
      const bodies = [];
      for (let m; (m = await ch.get(queue, { noAck: true }));) bodies.push(m.content.toString());
      ev.push(bodies);
      const bad = await channel(conn);
      await step(ev, () => bad.bindQueue(queue, dst, '', { 'x-match': 'some' }));
      await ch.deleteExchange(dst); await ch.deleteExchange(src);
    });
  },
  async unknown_exchange_type(ev) {
    await withConn(async (conn) => {
      await step(ev, async () => (await channel(conn)).assertExchange('e2e-x-' + uid(), 'no-such-type'));
    });
  },
  async update_secret(ev) {
    await withConn(async (conn) => {
      if (typeof conn.updateSecret !== 'function') { ev.push('no updateSecret'); return; }
      const pw = decodeURIComponent(new URL(url).password || 'guest');
      await step(ev, () => conn.updateSecret(Buffer.from(pw), 'token refresh'));
      await step(ev, async () => { await (await channel(conn)).assertQueue('', { exclusive: true }); });
    });
  },
  async many_channels(ev) {
    await withConn(async (conn) => {
      const chs = [];
      for (let i = 0; i < 50; i++) chs.push(await channel(conn));
      ev.push(chs.length);
    });
  },
};

(async () => {
  const out = {};
  const only = process.argv.slice(3);
  for (const [name, fn] of Object.entries(scenarios)) {
    if (only.length && !only.includes(name)) continue;
    const ev = [];
    try { await fn(ev); } catch (e) { ev.push(['scenario-error', String(e && e.message)]); }
    out[name] = ev;
  }
  process.stdout.write(JSON.stringify(out) + '\n');
  process.exit(0);
})();
