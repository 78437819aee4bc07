// Validates tool arguments against tool input schemas with Ajv's JSON Schema 2020-12 validator
// (the validator the official TypeScript SDK uses), as a client that checks its arguments
// before calling would. Reads {"cases": [{"name", "schema", "args", "valid"}]} from the file
// named by argv[2]; prints one line a case and "N passed, M failed"; exits 1 when a case's
// outcome is not the one expected.
import { readFileSync } from "node:fs";
import Ajv2020 from "ajv/dist/2020.js";

const { cases } = JSON.parse(readFileSync(process.argv[2], "utf8"));
let passed = 0;
let failed = 0;
for (const c of cases) {
  // strict: false, as clients do: real schemas carry keywords Ajv does not know
  // (x-mcp-header, the lease keyword).
  const ajv = new Ajv2020({ strict: false, allErrors: true });
  let valid;
  let why = "";
  try {
    const check = ajv.compile(c.schema);
    valid = check(c.args);
    why = valid ? "" : ajv.errorsText(check.errors);
  } catch (e) {
    valid = false;
    why = `the schema does not compile: ${e.message}`;
  }
  const ok = valid === c.valid;
  if (ok) passed++;
  else failed++;
  console.log(`${ok ? "ok  " : "FAIL"} ${c.name}: ${valid ? "valid" : "invalid"} (expected ${c.valid ? "valid" : "invalid"}) ${why}`);
}
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed === 0 ? 0 : 1);
