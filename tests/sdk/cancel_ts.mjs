// A slow workflow for `troth cancel` with the TypeScript SDK (@resonatehq/sdk 0.11.x),
// for tests/sdk/test_sdk_cancel.py (the Python twin is tests/sdk/cancel.py).
//
//   node cancel_ts.mjs URL GROUP ID STEPS OTHER OTHER_STEPS TIMEOUT_S
//
// Runs workflow ID (STEPS sequential ctx.run steps of 0.3 s) and, beside it in the
// same worker, workflow OTHER.  Every step prints `start <workflow> <i> <unix time>`
// as it begins; each workflow ends with `result <workflow> <value>`,
// `error <workflow> <message>` or `gave-up <workflow>`, then `done`.  The
// Promise.withResolvers polyfill is preloaded with `node --import`.
const { Resonate } = await import("@resonatehq/sdk");

async function step(ctx, wf, i) {
  console.log(`start ${wf} ${i} ${(Date.now() / 1000).toFixed(3)}`);
  await new Promise((resolve) => setTimeout(resolve, 300));
  return i;
}

function* slow(ctx, wf, n) {
  let total = 0;
  for (let i = 0; i < n; i++) total += yield* ctx.run(step, wf, i);
  return total;
}

const [url, group, id, steps, other, otherSteps, timeoutS] = process.argv.slice(2);
const r = new Resonate({ url, group });
const wf = r.register("slow", slow);

async function follow(name, n) {
  let timer;
  const gaveUp = new Promise((resolve) => {
    timer = setTimeout(() => resolve("gave-up"), Number(timeoutS) * 1000);
  });
  try {
    const value = await Promise.race([wf.run(name, name, Number(n)), gaveUp]);
    console.log(value === "gave-up" ? `gave-up ${name}` : `result ${name} ${value}`);
  } catch (err) {
    console.log(`error ${name} ${err && err.message ? err.message : err}`);
  } finally {
    clearTimeout(timer);
  }
}

await Promise.all([follow(id, steps), follow(other, otherSteps)]);
console.log("done");
await r.stop();
process.exit(0);
