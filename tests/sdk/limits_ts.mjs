// A fan-out of RPCs to a worker group with a concurrency limit, with the TypeScript
// SDK (@resonatehq/sdk 0.11.x), for tests/sdk/test_sdk_limits.py (the Python twin
// is tests/sdk/limits.py, with the same options).
//
//   node limits_ts.mjs worker --url URL --group G --name W [--ttl S] [--sleep S]
//                             [--acquire-delay S]
//   node limits_ts.mjs client --url URL --target G --id ID --steps N --seconds S
//
// `worker` joins group G and runs `step` until it is killed; every step prints
// `start <worker> <i> <unix time>` when it begins and `end <worker> <i> <unix time>`
// when its sleep is over (before the SDK fulfils its task), so the printed interval
// lies within the one its task held a slot.  `--ttl` is the SDK's task lease;
// `--sleep` makes every step of this worker take that long; `--acquire-delay` holds
// each `task.acquire` that long before it is sent (this program's wrapper around the
// SDK's HttpNetwork, not the SDK's own doing) and prints
// `acquire-delayed <worker> <task> <unix time>`: a worker slow to take what it was
// sent.  `client` (group `driver`) runs workflow ID, which fans out N `step` RPCs of
// S seconds to group G and returns the sum of their squares, and prints
// `result <id> <value>` (or `error`/`gave-up`).  The Promise.withResolvers polyfill
// is preloaded with `node --import`.
import { parseArgs } from "node:util";

const { Resonate, HttpNetwork, PollMessageSource } = await import("@resonatehq/sdk");

const { positionals, values: a } = parseArgs({
  allowPositionals: true,
  options: {
    url: { type: "string" },
    group: { type: "string", default: "limited" },
    name: { type: "string", default: "w" },
    ttl: { type: "string", default: "0" },
    sleep: { type: "string" },
    "acquire-delay": { type: "string", default: "0" },
    target: { type: "string", default: "limited" },
    id: { type: "string", default: "fanout" },
    steps: { type: "string", default: "50" },
    seconds: { type: "string", default: "0.2" },
    timeout: { type: "string", default: "50" },
  },
});
const mode = positionals[0];

const now = () => ((performance.timeOrigin + performance.now()) / 1000).toFixed(6);
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const NAME = a.name;
const SLEEP = a.sleep === undefined ? undefined : Number(a.sleep);

async function step(ctx, i, seconds) {
  console.log(`start ${NAME} ${i} ${now()}`);
  await sleep((SLEEP ?? seconds) * 1000);
  console.log(`end ${NAME} ${i} ${now()}`);
  return i * i;
}

function* fanout(ctx, n, seconds, target) {
  const futures = [];
  for (let i = 0; i < n; i++) {
    futures.push(yield* ctx.beginRpc("step", i, seconds, ctx.options({ target })));
  }
  let sum = 0;
  for (const f of futures) sum += yield* f;
  return sum;
}

if (mode === "worker") {
  const opts = { url: a.url, group: a.group };
  if (Number(a.ttl) > 0) opts.ttl = Number(a.ttl) * 1000;
  const delay = Number(a["acquire-delay"]) * 1000;
  if (delay > 0) {
    const pid = `${NAME}-${process.pid}`;
    const network = new HttpNetwork({
      url: a.url,
      adapter: new PollMessageSource({ url: `${a.url}/poll/${a.group}/${pid}` }),
    });
    const send = network.send;
    network.send = async (req) => {
      if (req.kind === "task.acquire") {
        console.log(`acquire-delayed ${NAME} ${req.data.id} ${now()}`);
        await sleep(delay);
      }
      return send(req);
    };
    Object.assign(opts, { pid, network });
  }
  const r = new Resonate(opts);
  r.register("step", step);
  console.log(`worker ${NAME} group=${a.group} pid=${r.pid}`);
  process.on("SIGTERM", async () => {
    await r.stop();
    process.exit(0);
  });
} else if (mode === "client") {
  const r = new Resonate({ url: a.url, group: "driver" });
  const wf = r.register("fanout", fanout);
  let timer;
  const gaveUp = new Promise((resolve) => {
    timer = setTimeout(() => resolve("gave-up"), Number(a.timeout) * 1000);
  });
  try {
    const value = await Promise.race([
      wf.run(a.id, Number(a.steps), Number(a.seconds), a.target),
      gaveUp,
    ]);
    console.log(value === "gave-up" ? `gave-up ${a.id}` : `result ${a.id} ${value}`);
  } catch (err) {
    console.log(`error ${a.id} ${err && err.message ? err.message : err}`);
  } finally {
    clearTimeout(timer);
  }
  await r.stop();
  process.exit(0);
} else {
  console.error("usage: node limits_ts.mjs worker|client --url URL [options]");
  process.exit(2);
}
