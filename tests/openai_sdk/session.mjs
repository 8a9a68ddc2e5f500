// A scripted session of the OpenAI Node SDK (npm `openai`, pinned by package-lock.json) against
// kvpush's router: completions, chat, streaming with include_usage, n, lists of prompts,
// logprobs (also with echo), seeds and one expected 400. Every step must succeed without an SDK error (an
// exception, a failed parse, a stream the SDK cannot read) and give the values the API defines.
//
// Usage: node session.mjs BASE_URL [MODE]   (BASE_URL like http://127.0.0.1:8000/v1; MODE, when
// given, is sent as the router's x-kvpush-mode header: push, pull, pull-vllm, pull-fast)
// Prints one line per step and "N passed, N failed"; exits 1 when a step failed.
import OpenAI from "openai";

const [baseURL, mode] = process.argv.slice(2);
if (!baseURL) {
  console.error("usage: node session.mjs BASE_URL [MODE]");
  process.exit(2);
}
const client = new OpenAI({
  baseURL, apiKey: "kvpush", maxRetries: 0, timeout: 120000,
  defaultHeaders: mode ? { "x-kvpush-mode": mode } : {} });
// The served model's name, as a client learns it.
const model = (await client.models.list()).data[0].id;

function check(cond, what) {
  if (!cond) throw new Error(`check failed: ${what}`);
}

async function drain(stream) {
  const chunks = [];
  for await (const chunk of stream) chunks.push(chunk);
  return chunks;
}

const prompt = "Once upon a time";
const steps = [
  ["models.list", async () => {
    const page = await client.models.list();
    const ids = page.data.map((m) => m.id);
    check(ids.includes(model), `served model ${model} in ${JSON.stringify(ids)}`);
  }],
  ["completions greedy", async () => {
    const r = await client.completions.create({ model, prompt, max_tokens: 12, temperature: 0 });
    check(r.object === "text_completion", "object text_completion");
    check(r.choices.length === 1 && r.choices[0].index === 0, "one choice, index 0");
    check(typeof r.choices[0].text === "string" && r.choices[0].text.length > 0, "text");
    check(["stop", "length"].includes(r.choices[0].finish_reason), "finish_reason");
    check(r.usage.total_tokens === r.usage.prompt_tokens + r.usage.completion_tokens, "usage");
  }],
  ["completions seeded twice give the same text", async () => {
    const req = { model, prompt, max_tokens: 12, temperature: 0.9, seed: 1234 };
    const a = await client.completions.create(req);
    const b = await client.completions.create(req);
    check(a.choices[0].text === b.choices[0].text, "same seed, same text");
  }],
  ["completions n=3", async () => {
    const r = await client.completions.create({
      model, prompt, max_tokens: 8, temperature: 0.9, seed: 40, n: 3 });
    check(r.choices.length === 3, "3 choices");
    r.choices.forEach((c, j) => check(c.index === j, `index ${j}`));
    // Choice j is the n = 1 request with seed + j (vLLM).
    const one = await client.completions.create({
      model, prompt, max_tokens: 8, temperature: 0.9, seed: 41 });
    check(one.choices[0].text === r.choices[1].text, "choice 1 = seed + 1");
  }],
  ["completions list of prompts", async () => {
    const r = await client.completions.create({
      model, prompt: [prompt, "The little dog"], max_tokens: 8, temperature: 0 });
    check(r.choices.length === 2, "2 choices");
    r.choices.forEach((c, i) => check(c.index === i, `index ${i}`));
    const second = await client.completions.create({
      model, prompt: "The little dog", max_tokens: 8, temperature: 0 });
    check(second.choices[0].text === r.choices[1].text, "prompt 1 as alone");
  }],
  ["completions logprobs", async () => {
    const r = await client.completions.create({
      model, prompt, max_tokens: 6, temperature: 0, logprobs: 2 });
    const lp = r.choices[0].logprobs;
    check(lp && lp.tokens.length === lp.token_logprobs.length, "tokens and logprobs");
    check(lp.top_logprobs.every((t) => Object.keys(t).length >= 1), "top_logprobs");
    check(lp.token_logprobs.every((x) => x <= 0), "logprobs <= 0");
  }],
  ["completions echo + logprobs", async () => {
    const plain = await client.completions.create({
      model, prompt, max_tokens: 6, temperature: 0, logprobs: 2 });
    const r = await client.completions.create({
      model, prompt, max_tokens: 6, temperature: 0, logprobs: 2, echo: true });
    const lp = r.choices[0].logprobs;
    const n = r.usage.prompt_tokens;
    check(r.choices[0].text === prompt + plain.choices[0].text, "prompt leads the text");
    check(lp.tokens.length === n + plain.choices[0].logprobs.tokens.length,
          "prompt tokens then generated tokens");
    check(lp.token_logprobs[0] === null && lp.top_logprobs[0] === null, "first prompt token null");
    check(lp.token_logprobs.slice(1).every((x) => x <= 0), "logprobs <= 0");
    check(JSON.stringify(lp.token_logprobs.slice(n)) ===
          JSON.stringify(plain.choices[0].logprobs.token_logprobs), "generated part as plain");
    const chunks = await drain(await client.completions.create({
      model, prompt, max_tokens: 6, temperature: 0, logprobs: 2, echo: true, stream: true }));
    check(chunks[0].choices[0].logprobs.tokens.length === n + 1, "prompt part in first event");
    check(chunks.map((c) => c.choices[0].text).join("") === r.choices[0].text, "stream text");
  }],
  ["completions stream include_usage", async () => {
    const stream = await client.completions.create({
      model, prompt, max_tokens: 10, temperature: 0, stream: true,
      stream_options: { include_usage: true } });
    const chunks = await drain(stream);
    const text = chunks.flatMap((c) => c.choices.map((x) => x.text)).join("");
    const last = chunks[chunks.length - 1];
    check(last.choices.length === 0 && last.usage && last.usage.completion_tokens > 0,
          "usage chunk last");
    const whole = await client.completions.create({
      model, prompt, max_tokens: 10, temperature: 0 });
    check(text === whole.choices[0].text, "streamed text = whole text");
  }],
  ["completions stream list + n=2", async () => {
    const stream = await client.completions.create({
      model, prompt: [prompt, "The little dog"], n: 2, max_tokens: 6, temperature: 0.8,
      seed: 5, stream: true, stream_options: { include_usage: true } });
    const chunks = await drain(stream);
    const seen = new Set(chunks.flatMap((c) => c.choices.map((x) => x.index)));
    check([0, 1, 2, 3].every((i) => seen.has(i)) && seen.size === 4, "indexes 0..3");
    check(chunks[chunks.length - 1].usage.prompt_tokens > 0, "summed usage");
  }],
  ["chat", async () => {
    const r = await client.chat.completions.create({
      model, messages: [{ role: "user", content: "Tell me a story." }], max_tokens: 12,
      temperature: 0 });
    check(r.object === "chat.completion", "object chat.completion");
    check(r.choices[0].message.role === "assistant", "assistant message");
    check(typeof r.choices[0].message.content === "string", "content");
  }],
  ["chat logprobs + top_logprobs", async () => {
    const r = await client.chat.completions.create({
      model, messages: [{ role: "user", content: "Hello" }], max_tokens: 6, temperature: 0,
      logprobs: true, top_logprobs: 2 });
    const content = r.choices[0].logprobs.content;
    check(content.length > 0, "logprobs.content");
    check(content.every((t) => t.top_logprobs.length === 2), "2 top logprobs");
  }],
  ["chat n=2", async () => {
    const r = await client.chat.completions.create({
      model, messages: [{ role: "user", content: "Hello" }], max_tokens: 6, temperature: 0.9,
      seed: 9, n: 2 });
    check(r.choices.length === 2 && r.choices[1].index === 1, "2 choices");
  }],
  ["chat stream include_usage", async () => {
    const stream = await client.chat.completions.create({
      model, messages: [{ role: "user", content: "Tell me a story." }], max_tokens: 10,
      temperature: 0, stream: true, stream_options: { include_usage: true } });
    const chunks = await drain(stream);
    check(chunks[0].choices[0].delta.role === "assistant", "role first");
    const last = chunks[chunks.length - 1];
    check(last.usage && last.usage.completion_tokens > 0, "usage chunk");
  }],
  ["chat stream helper (runner)", async () => {
    const runner = client.chat.completions.stream({
      model, messages: [{ role: "user", content: "Hi" }], max_tokens: 6, temperature: 0 });
    const done = await runner.finalChatCompletion();
    check(done.choices[0].message.role === "assistant", "final message");
  }],
  ["a bad request is an APIError with the API's fields", async () => {
    try {
      await client.completions.create({ model, prompt, temperature: -1 });
    } catch (e) {
      check(e instanceof OpenAI.BadRequestError, `BadRequestError, got ${e.constructor.name}`);
      check(e.status === 400 && e.type === "invalid_request_error", "status and type");
      check(e.param === "temperature", `param temperature, got ${e.param}`);
      return;
    }
    throw new Error("temperature -1 was accepted");
  }],
  ["an unknown model is a NotFoundError", async () => {
    try {
      await client.completions.create({ model: "no-such-model", prompt, max_tokens: 2 });
    } catch (e) {
      check(e instanceof OpenAI.NotFoundError, `NotFoundError, got ${e.constructor.name}`);
      check(e.code === "model_not_found", "code model_not_found");
      return;
    }
    throw new Error("an unknown model was accepted");
  }],
];

let passed = 0;
let failed = 0;
for (const [name, fn] of steps) {
  try {
    await fn();
    passed += 1;
    console.log(`ok   ${name}`);
  } catch (e) {
    failed += 1;
    console.log(`FAIL ${name}: ${e && e.constructor ? e.constructor.name : ""} ${e && e.message}`);
  }
}
console.log(`openai-sdk: ${passed} passed, ${failed} failed`);
process.exit(failed === 0 ? 0 : 1);
