// A Node.js device written with MQTT.js, driven by tests/interop: it sends the requests of a
// plan and prints what came back as JSON on stdout. Nothing of edgeinfer is used here.
//
//   node mqttjs_client.mjs '{"url": "mqtt://127.0.0.1:1883", "protocol": 5, ...}'
//
// plan fields: url, protocol (5 or 4 = 3.1.1), clientId, device, mode, and per mode:
//   requests: requests [{model, body}] sent one after another; each waits for its final message
//             (the first message for its id without "chunk"); prints {id: [messages]}.
//   latency:  warmup, then count sequential embeds of model; nodelay (TCP_NODELAY), replyQos
//             (0 or 1); prints {"ms": [round trip per timed request]}.
//   resend:   count requests to model, QoS 1, each re-sent under the same id every resendMs
//             until its final reply; prints progress lines ({"answered": n}) and then
//             {"finals", "resends", "replays", "redelivered", "unexplained"}.
import mqtt from "mqtt";

const plan = JSON.parse(process.argv[2]);
const v5 = plan.protocol === 5;
const replyTopic = `edgeinfer/clients/${plan.clientId}/reply`;
const options = {
  protocolVersion: plan.protocol,
  clientId: plan.clientId,
  clean: plan.mode !== "resend", // resend: a persistent session keeps QoS 1 replies
  reconnectPeriod: 200,
  connectTimeout: 10_000,
};
if (v5 && plan.mode === "resend") options.properties = { sessionExpiryInterval: 3600 };
const client = mqtt.connect(plan.url, options);
if (plan.nodelay) client.on("connect", () => client.stream.setNoDelay(true));

const waiting = new Map(); // id -> {messages, resolve}
const first = new Map(); // id -> its first final payload (resend mode counts what came again)
// Final messages that came again for an id: from the bridge's store ("replay": true), the
// broker delivering the same message again (identical bytes), or neither (must not happen).
const again = { replays: 0, redelivered: 0, unexplained: 0 };

client.on("message", (topic, payload, packet) => {
  const message = JSON.parse(payload.toString());
  // 3.1.1 has no correlation data: match by id, or by raw_id when the id was unusable.
  const id = v5 ? packet.properties?.correlationData?.toString() : (message.id ?? message.raw_id);
  if (!("chunk" in message)) {
    if (!first.has(id)) first.set(id, payload.toString());
    else if (message.replay === true) again.replays += 1;
    else if (first.get(id) === payload.toString()) again.redelivered += 1;
    else again.unexplained += 1;
  }
  const entry = waiting.get(id);
  if (entry === undefined) return; // a duplicate of something already answered: dropped
  entry.messages.push(message);
  if (!("chunk" in message)) {
    waiting.delete(id);
    entry.resolve(entry.messages);
  }
});

// body: an object (3.1.1: reply_to is added), or a string sent as is (malformed on purpose).
function send(model, body, key) {
  const topic = `edgeinfer/${plan.device}/${model}/req`;
  const correlationData = Buffer.from(String(key));
  const publish = v5 ? { qos: 1, properties: { responseTopic: replyTopic, correlationData } } : { qos: 1 };
  const payload = typeof body === "string" || v5 ? body : { ...body, reply_to: replyTopic };
  client.publish(topic, typeof payload === "string" ? payload : JSON.stringify(payload), publish);
}

// key: what matches the replies (the correlation data on v5, the id on 3.1.1).
function request(model, body, key = body.id) {
  return new Promise((resolve) => {
    waiting.set(key, { messages: [], resolve });
    send(model, body, key);
  });
}

async function main() {
  await new Promise((resolve) => client.once("connect", resolve));
  // The errors topic: answers to requests whose reply topic could not be read.
  const errors = `edgeinfer/${plan.device}/errors`;
  await client.subscribeAsync({ [replyTopic]: { qos: plan.replyQos ?? 1 }, [errors]: { qos: 1 } });
  if (plan.mode === "requests") {
    const out = {};
    for (const { model, body, key } of plan.requests) {
      out[key ?? body.id] = await request(model, body, key ?? body.id);
    }
    console.log(JSON.stringify(out));
  } else if (plan.mode === "latency") {
    const ms = [];
    for (let i = 0; i < (plan.warmup ?? 0); i++) {
      await request(plan.model, { id: `${plan.clientId}-warm-${i}`, text: `warm up ${i}` });
    }
    for (let i = 0; i < plan.count; i++) {
      const started = process.hrtime.bigint();
      await request(plan.model, { id: `${plan.clientId}-${i}`, text: `sensor reading ${i}` });
      ms.push(Number(process.hrtime.bigint() - started) / 1e6);
    }
    console.log(JSON.stringify({ ms }));
  } else if (plan.mode === "resend") {
    let resends = 0;
    for (let i = 0; i < plan.count; i++) {
      const body = { id: `${plan.clientId}-${i}`, text: `reading ${i} of valve 7` };
      const done = request(plan.model, body);
      let answered = false;
      done.then(() => (answered = true));
      while (!answered) {
        await Promise.race([done, new Promise((r) => setTimeout(r, plan.resendMs))]);
        if (!answered) {
          resends += 1;
          waiting.get(body.id) && send(plan.model, body, body.id); // the same id: answered once
        }
      }
      console.log(JSON.stringify({ answered: i + 1 }));
    }
    // Replies still on their way (re-sent ids) arrive within a resend period.
    await new Promise((r) => setTimeout(r, plan.resendMs));
    console.log(JSON.stringify({ finals: first.size, resends, ...again }));
  }
  await client.endAsync();
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
