'use strict';
/*
 * Drive npm ali-ons 3.12 (a RocketMQ remoting client in plain JavaScript) against a name
 * server. Runs with NODE_PATH pointing at the node_modules that tests/interop/provision.py
 * installed; imports nothing of ordermq. Every stdout line is one JSON object with an
 * "event" field; errors end it with exit code 2 (a client call failed) or 3 (--deadline).
 *
 *   node ons_driver.js selfcheck
 *   node ons_driver.js produce --namesrv 127.0.0.1:9876 --topic T --group G --keys 10 --rounds 10
 *   node ons_driver.js consume --namesrv 127.0.0.1:9876 --topic T --group G [--from first]
 *
 * Bodies are "<key>:<seq>"; the producer sets the key as the message's KEYS and, with
 * --sharding, as its shardingKey (ali-ons picks the queue by md5(key) % queue count).
 *
 * Events: "selfcheck" {ali_ons, node}; "started"; produce: "sent" per message {key, seq,
 * status, msg_id, queue, offset}, "done" {sent, seconds, rate}; consume: "message" per
 * listener call {key, seq, topic, queue, offset, msg_id, reconsume, tags, keys, body},
 * "client_error" for errors the client reports and survives, and on SIGTERM/SIGINT
 * "stopping", then "stopped" (offsets persisted, client unregistered), exit 0. The consumer
 * prints "started" only once it has the topic's queues, which it waits for up to
 * --route-timeout seconds (ali-ons itself starts without a name server and retries for
 * ever; it refreshes routes every --poll-ms, so the topic should exist before it starts).
 *
 * ali-ons needs an `httpclient` option even with a fixed name server (it is only used to
 * look the name server up over HTTP): a stub is passed. Without accessKeyId it signs
 * nothing. Its logger prints warnings and errors to stderr.
 */

const SPEC = {
  produce: {
    namesrv: null, topic: null, group: null, keys: '10', rounds: '1', 'first-seq': '0',
    tags: '', sharding: false, deadline: '0',
  },
  consume: {
    namesrv: null, topic: null, group: null, from: 'last', expression: '*', deadline: '0',
    'heartbeat-ms': '30000', 'persist-ms': '5000', 'rebalance-ms': '10000', 'poll-ms': '30000',
    'route-timeout': '30', 'body-chars': '200',
  },
  selfcheck: {},
};

function emit(event, fields) {
  process.stdout.write(JSON.stringify(Object.assign({ event }, fields || {})) + '\n');
}

let phase = 'starting';

function fail(message, code) {
  emit('error', { message, phase });
  process.exit(code || 2);
}

function usage(message) {
  process.stderr.write(`ons_driver.js: error: ${message}\n` +
    'usage: ons_driver.js {selfcheck|produce|consume} --namesrv HOST:PORT --topic T --group G ...\n');
  process.exit(2);
}

function parseArgs(argv) {
  const command = argv[0];
  if (!Object.prototype.hasOwnProperty.call(SPEC, command)) {
    usage(`unknown command ${JSON.stringify(command)}`);
  }
  const spec = SPEC[command];
  const args = { command };
  for (const [name, value] of Object.entries(spec)) {
    args[name] = value;
  }
  for (let i = 1; i < argv.length; i++) {
    const arg = argv[i];
    if (!arg.startsWith('--') || !Object.prototype.hasOwnProperty.call(spec, arg.slice(2))) {
      usage(`unknown argument ${JSON.stringify(arg)} for ${command}`);
    }
    const name = arg.slice(2);
    if (spec[name] === false) {
      args[name] = true;
      continue;
    }
    if (i + 1 >= argv.length) {
      usage(`${arg} needs a value`);
    }
    args[name] = argv[++i];
  }
  for (const [name, value] of Object.entries(args)) {
    if (value === null) {
      usage(`--${name} is required`);
    }
  }
  if (command !== 'selfcheck' && !/^[^:]+:\d{1,5}$/.test(args.namesrv)) {
    usage(`--namesrv must be HOST:PORT, got ${JSON.stringify(args.namesrv)}`);
  }
  for (const name of ['keys', 'rounds', 'first-seq', 'deadline', 'heartbeat-ms', 'persist-ms',
    'rebalance-ms', 'poll-ms', 'route-timeout', 'body-chars']) {
    if (name in args) {
      const n = Number(args[name]);
      if (!Number.isFinite(n) || n < 0) {
        usage(`--${name} must be a number >= 0, got ${JSON.stringify(args[name])}`);
      }
      args[name] = n;
    }
  }
  if (command === 'produce' && args.keys < 1) {
    usage('--keys must be at least 1');
  }
  if (command === 'consume' && !['first', 'last'].includes(args.from)) {
    usage(`--from must be first or last, got ${JSON.stringify(args.from)}`);
  }
  return args;
}

function startDeadline(seconds) {
  if (seconds > 0) {
    setTimeout(() => fail(`gave up after the --deadline of ${seconds} s`, 3), seconds * 1000)
      .unref();
  }
}

function parseBody(body) {
  const head = body.toString('utf8').split(' ', 1)[0];
  const at = head.lastIndexOf(':');
  const seq = head.slice(at + 1);
  if (at > 0 && /^\d+$/.test(seq)) {
    return [ head.slice(0, at), Number(seq) ];
  }
  return [ null, null ];
}

const httpclient = {
  async request() {
    throw new Error('no HTTP name server lookup: pass nameSrv');
  },
};

function keyNames(count) {
  const width = Math.max(3, String(Math.max(count - 1, 0)).length);
  return Array.from({ length: count }, (_, i) => 'k' + String(i).padStart(width, '0'));
}

async function produce(a) {
  const { Producer, Message } = require('ali-ons');
  const producer = new Producer({ httpclient, nameSrv: a.namesrv, producerGroup: a.group });
  producer.on('error', err => emit('client_error', { message: String(err && err.message) }));
  phase = 'starting the producer';
  await producer.ready();
  const keys = keyNames(a.keys);
  emit('started', { pid: process.pid, keys: keys.length, rounds: a.rounds });
  const began = process.hrtime.bigint();
  let sent = 0;
  for (let seq = a['first-seq']; seq < a['first-seq'] + a.rounds; seq++) {
    for (const key of keys) {
      phase = `sending ${key}:${seq}`;
      const msg = new Message(a.topic, a.tags || null, `${key}:${seq}`);
      msg.keys = [ key ];
      if (a.sharding) {
        msg.shardingKey = key;
      }
      let result;
      try {
        result = await producer.send(msg);
      } catch (err) {
        fail(`send of ${key}:${seq} failed: ${err.name}: ${err.message}`);
      }
      sent++;
      emit('sent', {
        key, seq, status: result.sendStatus, msg_id: result.msgId,
        // queueId comes back as the reply's extFields value: a string
        queue: result.messageQueue ? Number(result.messageQueue.queueId) : null,
        offset: result.queueOffset,
      });
    }
  }
  const seconds = Number(process.hrtime.bigint() - began) / 1e9;
  emit('done', { sent, seconds, rate: sent / Math.max(seconds, 1e-9) });
  phase = 'closing the producer';
  await producer.close();
  process.exit(0);
}

async function consume(a) {
  const { Consumer } = require('ali-ons');
  const ConsumeFromWhere = require('ali-ons/lib/consumer/consume_from_where');
  const consumer = new Consumer({
    httpclient,
    nameSrv: a.namesrv,
    consumerGroup: a.group,
    consumeFromWhere: a.from === 'first' ?
      ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET : ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
    heartbeatBrokerInterval: a['heartbeat-ms'],
    persistConsumerOffsetInterval: a['persist-ms'],
    rebalanceInterval: a['rebalance-ms'],
    pollNameServerInteval: a['poll-ms'],
  });
  consumer.on('error', err => emit('client_error', { message: String(err && err.message) }));
  consumer.subscribe(a.topic, a.expression, async msg => {
    const body = msg.body || Buffer.alloc(0);
    const [ key, seq ] = parseBody(body);
    emit('message', {
      key, seq, topic: msg.topic, queue: msg.queueId, offset: msg.queueOffset,
      msg_id: msg.msgId, reconsume: msg.reconsumeTimes, tags: msg.tags || '',
      keys: msg.keys || '', body: body.slice(0, a['body-chars']).toString('utf8'),
    });
  });
  let stopping = false;
  const stop = async () => {
    if (stopping) {
      return;
    }
    stopping = true;
    emit('stopping');
    phase = 'closing (offsets persisted, client unregistered)';
    const began = Date.now();
    await consumer.close();
    emit('stopped', { shutdown_seconds: (Date.now() - began) / 1000 });
    process.exit(0);
  };
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
  phase = 'starting the consumer';
  await consumer.ready();
  await waitForRoute(consumer, a);
  emit('started', { pid: process.pid, group: a.group, topic: a.topic, client_id: consumer.clientId });
  phase = 'consuming';
}

// ali-ons starts whether or not a name server answers, and then retries for ever: wait for
// the topic's queues (its own subscription table, filled from the route) for a bounded time.
async function waitForRoute(consumer, a) {
  phase = `waiting for the route of ${a.topic} from ${a.namesrv}`;
  const deadline = Date.now() + a['route-timeout'] * 1000;
  for (;;) {
    const queues = consumer._topicSubscribeInfoTable.get(a.topic);
    if (queues && queues.length) {
      return;
    }
    if (Date.now() >= deadline) {
      fail(`no route for topic ${a.topic} from the name server at ${a.namesrv} within ` +
        `${a['route-timeout']} s (nothing answers there, or the topic does not exist)`);
    }
    await new Promise(resolve => setTimeout(resolve, 200));
  }
}

function selfcheck() {
  const ons = require('ali-ons');
  const { version } = require('ali-ons/package.json');
  if (typeof ons.Producer !== 'function' || typeof ons.Consumer !== 'function') {
    fail('ali-ons exports no Producer and Consumer');
  }
  emit('selfcheck', { ali_ons: version, node: process.versions.node });
  process.exit(0);
}

function main() {
  const a = parseArgs(process.argv.slice(2));
  startDeadline(a.deadline || 0);
  const run = { selfcheck, produce, consume }[a.command];
  Promise.resolve().then(() => run(a)).catch(err => fail(`${err.name}: ${err.message}`));
}

main();
