// The checks of the TypeScript clients in this directory: one line per check ("ok" or "FAIL",
// with the detail of a failure), then a closing "N passed, N failed" line, and exit status 1 on
// any failure. The tests copy it beside each client, into the directory where the client's
// packages are installed (support/node.rs, `Node::script`).

const results = [];

/** Records one check and prints its line. */
export function check(name, ok, detail) {
  results.push(Boolean(ok));
  const extra = !ok && detail !== undefined ? `: ${typeof detail === "string" ? detail : JSON.stringify(detail)}` : "";
  console.log(`${ok ? "ok  " : "FAIL"} ${name}${extra}`);
}

/** Runs `f`; a throw is the failed check `name`. */
export async function attempt(name, f) {
  try {
    await f();
  } catch (e) {
    check(name, false, String(e?.stack ?? e));
  }
}

/** Runs the client's `main` (a throw is a failed check), prints the tally and exits. */
export async function run(main) {
  try {
    await main();
  } catch (e) {
    check("the client ran to the end", false, String(e?.stack ?? e));
  }
  const failed = results.filter((ok) => !ok).length;
  console.log(`${results.length - failed} passed, ${failed} failed`);
  process.exit(failed ? 1 : 0);
}
