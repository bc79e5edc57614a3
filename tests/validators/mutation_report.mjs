// Validate a report against the mutation-testing report schema, as its
// package ships it (npm `mutation-testing-report-schema`, never a copy of
// ours): `node mutation_report.mjs REPORT.json` prints `valid`, or the
// schema's errors and exits 1.
import Ajv from "ajv";
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";

const require = createRequire(import.meta.url);
const schema = require("mutation-testing-report-schema/mutation-testing-report-schema.json");
const validate = new Ajv({ allErrors: true, strict: false }).compile(schema);
const report = JSON.parse(readFileSync(process.argv[2], "utf8"));
if (!validate(report)) {
  console.log(JSON.stringify(validate.errors, null, 2));
  process.exit(1);
}
console.log("valid");
