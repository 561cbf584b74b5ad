// Preloaded with `node --import` before every TypeScript SDK program the tests run.
//
// @resonatehq/sdk 0.11.5 declares engines.node >= 22, but on Node 20 the only builtin
// it misses is Promise.withResolvers (SDK-CLIENTS.md §1). Polyfilling it here, before
// any module of the SDK loads, lets the test machines' Node 20 run the real SDK; on
// Node >= 22 this file does nothing.
if (!Promise.withResolvers) {
  Promise.withResolvers = () => {
    let resolve;
    let reject;
    const promise = new Promise((a, b) => {
      resolve = a;
      reject = b;
    });
    return { promise, resolve, reject };
  };
}
