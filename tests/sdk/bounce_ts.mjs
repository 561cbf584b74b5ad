// A task that keeps bouncing, with the TypeScript SDK (@resonatehq/sdk 0.11.x), for
// troth's tests (tests/sdk/test_sdk_bounce.py).
//
//   node bounce_ts.mjs worker URL GROUP lacking|having  # a worker of GROUP
//   node bounce_ts.mjs start  URL ID GROUP              # rpc "bounced"(ID) on GROUP
//
// A `lacking` worker registers only "other": an execute for "bounced" makes it log
// "is not registered. Will drop." and release the task, which troth offers again.
// A `having` worker registers "bounced".  Workers print `worker ready` and run until
// killed; `start` prints `result -> <value>` when the rpc completes.
const { Resonate } = await import("@resonatehq/sdk");

function bounced(ctx, x) {
  return `ran ${x}`;
}
function other(ctx, x) {
  return x;
}

const [mode, url, ...rest] = process.argv.slice(2);

if (mode === "worker") {
  const [group, kind] = rest;
  const r = new Resonate({ url, group });
  r.register("other", other);
  if (kind === "having") r.register("bounced", bounced);
  console.log("worker ready");
  setInterval(() => {}, 60_000); // until killed
} else if (mode === "start") {
  const [id, group] = rest;
  const r = new Resonate({ url, group: "clients" });
  console.log("result ->", await r.rpc(id, "bounced", id, r.options({ target: group })));
  await r.stop();
  process.exit(0);
} else {
  console.error("usage: node bounce_ts.mjs worker URL GROUP lacking|having | start URL ID GROUP");
  process.exit(2);
}
