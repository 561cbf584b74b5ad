// Human in the loop with the TypeScript SDK (@resonatehq/sdk 0.11.x, generator engine),
// for troth's tests (tests/test_sdk_hitl.py).  The workflow waits on a durable promise
// (`ctx.promise()`) that someone else settles later; the SDK tags that promise only
// `resonate:scope: global` (no `resonate:external`, no target), see docs/protocol.md.
//
//   node hitl_ts.mjs run    URL ID GROUP         # runs approval(ID) in this process
//   node hitl_ts.mjs settle URL PROMISE_ID VALUE # resolves PROMISE_ID with VALUE
//
// `run` prints `awaiting <promise id>` each time the workflow body reaches the wait
// (once per replay) and `result -> <value>` at the end; `settle` prints
// `settled <promise id> <state>`.  The Promise.withResolvers polyfill is preloaded
// with `node --import` (tests/sdk/withresolvers.mjs).
const { Resonate } = await import("@resonatehq/sdk");

function* approval(ctx, request) {
  const answer = yield* ctx.promise();
  console.log(`awaiting ${answer.id}`);
  const verdict = yield* answer;
  return `${request}: ${verdict}`;
}

const [mode, url, ...rest] = process.argv.slice(2);

if (mode === "run") {
  const [id, group] = rest;
  const r = new Resonate({ url, group });
  const wf = r.register("approval", approval);
  console.log("result ->", await wf.run(id, `request ${id}`));
  await r.stop();
  process.exit(0);
} else if (mode === "settle") {
  const [promiseId, value] = rest;
  const r = new Resonate({ url, group: "settlers" });
  // The SDK's codec: the value is base64 of its JSON.
  const data = Buffer.from(JSON.stringify(value)).toString("base64");
  const p = await r.promises.resolve(promiseId, { data });
  console.log(`settled ${p.id} ${p.state}`);
  await r.stop();
  process.exit(0);
} else {
  console.error("usage: node hitl_ts.mjs run URL ID GROUP | settle URL PROMISE_ID VALUE");
  process.exit(2);
}
