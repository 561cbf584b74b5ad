// Preloaded (`node --import`) only where a test runs a TypeScript SDK program that
// relies on RESONATE_TOKEN alone (the unmodified shared example_ts.mjs).
//
// @resonatehq/sdk 0.11.5 reads RESONATE_TOKEN for its POSTs (HttpNetwork) but hands
// its SSE reader (PollMessageSource) only the `token:` given to `new Resonate`, so
// with the token in the environment alone `GET /poll/{group}/{pid}` goes out without
// `Authorization` and any server with auth on answers 401 — the worker never hears
// an execute, the client never hears an unblock (docs/security.md, "SDKs").  This
// adds `Authorization: Bearer $RESONATE_TOKEN` to those GETs when they lack one,
// which is what the SDK does for its POSTs; programs that pass `token:` (as
// tenant_ts.mjs does, the fix for users) do not need it.
const token = process.env.RESONATE_TOKEN;
if (token) {
  const original = globalThis.fetch;
  globalThis.fetch = (input, init = {}) => {
    const url = typeof input === "string" ? input : (input.url ?? String(input));
    const headers = new Headers(init.headers ?? {});
    if (new URL(url).pathname.startsWith("/poll/") && !headers.has("authorization")) {
      headers.set("authorization", `Bearer ${token}`);
      return original(input, { ...init, headers });
    }
    return original(input, init);
  };
}
