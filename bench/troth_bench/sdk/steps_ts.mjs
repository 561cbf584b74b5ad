// N sequential ctx.run steps with the TypeScript SDK (@resonatehq/sdk 0.11.x), for
// `troth bench --workloads sdk-steps` (bench/troth_bench/sdk_steps.py).
//
//   node steps_ts.mjs URL|local N ID
//
// Runs a short warm-up workflow (connections opened, code JIT-compiled), prints
// `warmed`, waits for a line on stdin (the bench reads troth's metrics meanwhile),
// runs the measured workflow and prints one JSON line: the monotonic time (ms) at which each
// step's function started (first call only) and the workflow's wall time.  A step's
// latency is the gap between two consecutive starts.  The bench copies this file
// next to the SDK's node_modules (ESM resolves bare imports from the script's
// directory); Node 20 lacks Promise.withResolvers, which the SDK uses.
if (!Promise.withResolvers) {
  Promise.withResolvers = () => {
    let resolve, reject;
    const promise = new Promise((a, b) => { resolve = a; reject = b; });
    return { promise, resolve, reject };
  };
}
const { Resonate } = await import("@resonatehq/sdk");

const STARTS = new Map();

function step(ctx, run, i) {
  if (!STARTS.has(run)) STARTS.set(run, new Map());
  const m = STARTS.get(run);
  if (!m.has(i)) m.set(i, performance.now());
  return i;
}

function* steps(ctx, run, n) {
  let total = 0;
  for (let i = 0; i < n; i++) total += yield* ctx.run(step, run, i);
  return total;
}

const [target, nText, wf] = process.argv.slice(2);
const n = Number(nText);
const r = target === "local" ? new Resonate() : new Resonate({ url: target, group: "steps" });
r.register(step);
const fn = r.register(steps);
const warm = Math.min(n, 20);
const w = await fn.run(`${wf}-warm`, "warm", warm);
if (w !== (warm * (warm - 1)) / 2) throw new Error(`warm-up returned ${w}`);
console.log("warmed");
await new Promise((resolve) => process.stdin.once("data", resolve));
process.stdin.pause();
const began = performance.now();
const got = await fn.run(wf, "run", n);
const ended = performance.now();
if (got !== (n * (n - 1)) / 2) throw new Error(`run returned ${got}`);
await r.stop();
const m = STARTS.get("run");
const starts = [];
for (let i = 0; i < n; i++) starts.push(m.get(i));
console.log(JSON.stringify({ steps: n, began, ended, starts }));
process.exit(0);
