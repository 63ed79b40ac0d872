'use strict';
/*
 * Drive Apache RocketMQ's Node.js client (npm `rocketmq-client-nodejs`, RocketMQ 5's gRPC
 * API) against mockbroker's v2 front. Installed into its own node_modules by
 * tests/interop/provision.py (NODE_PATH points there). Every line on stdout is one JSON
 * object with an "event" field; errors end it with exit code 2 (a client call failed), 3
 * (the --deadline passed) or, for bad arguments, a message on stderr and exit code 2
 * before anything is printed. The client logs to $HOME/logs/rocketmq/: one HOME per run.
 *
 *   rmq5_driver.js selfcheck
 *   rmq5_driver.js produce --endpoints 127.0.0.1:8090 --topic T [--count N] [--groups G]
 *                          [--delay-ms D] [--tag TAG] [--keys] [--recall]
 *   rmq5_driver.js simple  --endpoints E --topic T --group G --expect N [--invisible-ms MS]
 *                          [--no-ack] [--await-ms MS]
 *
 * produce and simple take --tls (the client's own switch, `sslEnabled: true`: a TLS
 * channel trusting gRPC's default roots) and --tls-ca FILE (--tls, trusting the CA in FILE
 * instead). The client has no option for a CA of its own: --tls-ca sets
 * GRPC_DEFAULT_SSL_ROOTS_FILE_PATH, which @grpc/grpc-js reads its default roots from when
 * it loads, before the client is loaded.
 *
 * Events as tests/interop/rmq5_driver.py prints them: "started", "sent", "recalled",
 * "done", "message", "acked".
 */

const path = require('path');

// Loaded in main(), once --tls-ca is in the environment (@grpc/grpc-js reads it on load).
let Producer;
let SimpleConsumer;

function emit(event, fields) {
  process.stdout.write(JSON.stringify({ event, ...fields }) + '\n');
}

let phase = 'starting';

function fail(message, code) {
  emit('error', { message, phase });
  process.exitCode = code || 2;
  // Let stdout drain, then end whatever the client still runs (timers, channels).
  setImmediate(() => process.exit(code || 2));
}

function usage(message) {
  process.stderr.write(`rmq5_driver.js: ${message}\n`);
  process.exit(2);
}

function parse(argv) {
  const [ command, ...rest ] = argv;
  const known = {
    selfcheck: [],
    produce: [ 'endpoints', 'topic', 'count', 'groups', 'delay-ms', 'tag', 'keys', 'recall', 'deadline', 'tls', 'tls-ca' ],
    simple: [ 'endpoints', 'topic', 'group', 'expect', 'invisible-ms', 'no-ack', 'await-ms', 'tag', 'deadline', 'tls', 'tls-ca' ],
  };
  if (!(command in known)) usage(`unknown command ${JSON.stringify(command)}; use selfcheck, produce or simple`);
  const flags = new Set([ 'keys', 'recall', 'no-ack', 'tls' ]);
  const opts = { command };
  for (let i = 0; i < rest.length; i++) {
    const name = rest[i].replace(/^--/, '');
    if (!rest[i].startsWith('--') || !known[command].includes(name)) usage(`unknown option ${rest[i]}`);
    if (flags.has(name)) {
      opts[name] = true;
    } else {
      if (i + 1 >= rest.length) usage(`${rest[i]} needs a value`);
      opts[name] = rest[++i];
    }
  }
  const numbers = [ 'count', 'groups', 'delay-ms', 'expect', 'invisible-ms', 'await-ms', 'deadline' ];
  for (const name of numbers) {
    if (name in opts) {
      const value = Number(opts[name]);
      if (!Number.isFinite(value) || value < 0) usage(`--${name} must be a number`);
      opts[name] = value;
    }
  }
  for (const name of [ 'endpoints', 'topic' ].concat(command === 'simple' ? [ 'group', 'expect' ] : [])) {
    if (command !== 'selfcheck' && !(name in opts)) usage(`--${name} is required`);
  }
  opts.sslEnabled = Boolean(opts.tls || opts['tls-ca']);
  return opts;
}

function describe(message) {
  const text = message.body.toString('utf8');
  const match = /^([^:]*):(\d+)$/.exec(text);
  return {
    key: match ? match[1] : null,
    seq: match ? Number(match[2]) : null,
    topic: message.topic,
    message_id: message.messageId,
    tag: message.tag || null,
    keys: [ ...message.keys ].sort(),
    group: message.messageGroup || null,
    attempt: message.deliveryAttempt,
    properties: Object.fromEntries(message.properties),
    born_host: message.bornHost,
    delivery_timestamp: message.deliveryTimestamp ? message.deliveryTimestamp.getTime() : null,
    corrupted: message.corrupted,
    body: text,
  };
}

async function produce(o) {
  phase = 'startup';
  const producer = new Producer({
    endpoints: o.endpoints, namespace: '', topics: [ o.topic ], sslEnabled: o.sslEnabled,
  });
  await producer.startup();
  emit('started', { client_id: producer.clientId });
  const keys = o.groups ? Array.from({ length: o.groups }, (_, g) => `group-${g}`) : [ 'k' ];
  let sent = 0;
  phase = 'sending';
  for (let seq = 0; seq < (o.count ?? 1); seq++) {
    for (const key of keys) {
      const message = { topic: o.topic, body: Buffer.from(`${key}:${seq}`) };
      if (o.tag) message.tag = o.tag;
      if (o.keys) message.keys = [ `${key}-${seq}` ];
      if (o.groups) message.messageGroup = key;
      if (o['delay-ms']) message.delay = o['delay-ms'];
      const receipt = await producer.send(message);
      sent++;
      emit('sent', { key, seq, message_id: receipt.messageId, offset: receipt.offset,
        recall_handle: receipt.recallHandle || null });
      if (o.recall) {
        const recalled = await producer.recallMessage(o.topic, receipt.recallHandle);
        emit('recalled', { message_id: recalled.messageId });
      }
    }
  }
  phase = 'shutdown';
  await producer.shutdown();
  emit('done', { sent });
}

async function simple(o) {
  phase = 'startup';
  const consumer = new SimpleConsumer({
    endpoints: o.endpoints, namespace: '', consumerGroup: o.group,
    subscriptions: new Map([ [ o.topic, o.tag || '*' ] ]), awaitDuration: o['await-ms'] ?? 5000,
    sslEnabled: o.sslEnabled,
  });
  await consumer.startup();
  emit('started', { client_id: consumer.clientId });
  const seen = new Set();
  phase = 'receiving';
  while (seen.size < o.expect) {
    for (const message of await consumer.receive(16, o['invisible-ms'] ?? 30000)) {
      seen.add(message.messageId);
      emit('message', describe(message));
      if (!o['no-ack']) {
        await consumer.ack(message);
        emit('acked', { message_id: message.messageId });
      }
    }
  }
  phase = 'shutdown';
  await consumer.shutdown();
  emit('done', { received: seen.size });
}

async function main() {
  const o = parse(process.argv.slice(2));
  if (o['tls-ca']) process.env.GRPC_DEFAULT_SSL_ROOTS_FILE_PATH = path.resolve(o['tls-ca']);
  ({ Producer, SimpleConsumer } = require('rocketmq-client-nodejs'));
  if (o.command === 'selfcheck') {
    const version = require('rocketmq-client-nodejs/package.json').version;
    new Producer({ endpoints: '127.0.0.1:1', namespace: '' });
    emit('selfcheck', { rocketmq_client_nodejs: version, node: process.versions.node });
    process.exit(0);
  }
  const deadline = o.deadline ?? 300;
  setTimeout(() => fail(`deadline of ${deadline} s passed`, 3), deadline * 1000).unref();
  try {
    await (o.command === 'produce' ? produce(o) : simple(o));
    process.exit(0);
  } catch (err) {
    fail(`${err && err.name}: ${err && err.message}${err && err.cause ? ` (${err.cause.message || err.cause})` : ''}`, 2);
  }
}

main();
