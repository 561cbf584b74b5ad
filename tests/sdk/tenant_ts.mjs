// A tenant's program for the auth tests (@resonatehq/sdk 0.11.x): every id it names
// starts with PREFIX and it polls only the groups it is given, so a prefix token can
// cover all of it (tests/sdk/test_sdk_auth.py; tenant.py is the Python twin).
//
//   node tenant_ts.mjs worker URL GROUP                      # runs remoteSquare
//   node tenant_ts.mjs client URL GROUP WORKERS PREFIX SUFFIX
//
// The token comes from RESONATE_TOKEN and is passed to `new Resonate({token})`
// explicitly: SDK 0.11.5 sends an environment-only token on its POSTs but not on its
// SSE stream (see poll_token.mjs), so this is how a TS program gets both.
const { Resonate } = await import("@resonatehq/sdk");

function greet(ctx, name) { return `hello ${name}`; }
function remoteSquare(ctx, x) { return x * x; }
function* workflow(ctx, name, workers) {
  const g = yield* ctx.run(greet, name);
  yield* ctx.sleep(300);
  const n = yield* ctx.rpc("remoteSquare", 7, ctx.options({ target: workers }));
  return `${g}! ${n}`;
}
function* rpcFanout(ctx, n, workers) {
  const futures = [];
  for (let i = 0; i < n; i++) {
    futures.push(yield* ctx.beginRpc("remoteSquare", i, ctx.options({ target: workers })));
  }
  let sum = 0;
  for (const f of futures) sum += yield* f;
  return sum;
}

const [mode, url, group, workers, prefix, suffix] = process.argv.slice(2);
const r = new Resonate({ url, group, token: process.env.RESONATE_TOKEN });

if (mode === "worker") {
  r.register(remoteSquare);
  console.log(`worker ready group=${group}`);
  setTimeout(async () => { await r.stop(); process.exit(0); }, 60_000);
} else if (mode === "client") {
  r.register(greet);
  const wf = r.register(workflow);
  const rf = r.register(rpcFanout);
  console.log("workflow   ->", await wf.run(`${prefix}wf-${suffix}`, "world", workers));
  console.log("rpc_fanout ->", await rf.run(`${prefix}fan-${suffix}`, 5, workers));
  console.log("rpc        ->", await r.rpc(`${prefix}rpc-${suffix}`, "remoteSquare", 9, r.options({ target: workers })));
  await r.stop();
  process.exit(0);
} else {
  console.error("usage: node tenant_ts.mjs worker URL GROUP | client URL GROUP WORKERS PREFIX SUFFIX");
  process.exit(2);
}
