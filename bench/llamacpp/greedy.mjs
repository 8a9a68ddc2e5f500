// One timed greedy generation through llama.cpp (npm node-llama-cpp@3.22.1, its prebuilt CPU build),
// the llama.cpp side of bench/model_vs_llamacpp.py; timed as bench/model/model_greedy_bench.cc
// times kvpush:
//   prefill s = from handing the prompt to sequence.evaluate() until generated token 1 arrives
//   decode s  = the next `decode` tokens (each one an evaluation of the previous token + sampling)
// An untimed warm-up generation runs first on the same context; the sequence is cleared between.
// Prints one JSON object on stdout: {"prefill_s", "decode_s", "prompt_len", "decode_steps",
// "tokens", "threads", "engine"}.
//
//   node greedy.mjs --model M.gguf --prompt-file ids.txt [--decode 48] [--threads 1]
import fs from "node:fs";
import {getLlama} from "node-llama-cpp";

function parseArgs(argv) {
    const a = {decode: "48", threads: "1"};
    for (let i = 0; i + 1 < argv.length; i += 2) a[argv[i].replace(/^--/, "")] = argv[i + 1];
    return a;
}

async function generate(sequence, prompt, decode) {
    const tokens = [];
    const t0 = performance.now();
    let t1 = t0;
    // temperature 0 = greedy (argmax); no repeat penalty; keep generating past an EOG token.
    for await (const token of sequence.evaluate(prompt, {temperature: 0, yieldEogToken: true})) {
        tokens.push(token);
        if (tokens.length === 1) t1 = performance.now();
        if (tokens.length === decode + 1) break;
    }
    const t2 = performance.now();
    return {prefill_s: (t1 - t0) / 1e3, decode_s: (t2 - t1) / 1e3, tokens};
}

const a = parseArgs(process.argv.slice(2));
const prompt = fs.readFileSync(a["prompt-file"], "utf8").trim().split(/\s+/).map(Number);
const decode = Number(a.decode), threads = Number(a.threads);
const llama = await getLlama({gpu: false, build: "never", maxThreads: threads, logLevel: "error"});
const model = await llama.loadModel({modelPath: a.model, gpuLayers: 0});
const context = await model.createContext({
    contextSize: prompt.length + decode + 16,
    batchSize: prompt.length,  // the whole prompt in one batch, as kvpush computes it in one chunk
    sequences: 1,
    threads: {ideal: threads, min: threads},
});
const sequence = context.getSequence();
await generate(sequence, prompt, decode);  // warm-up
await sequence.clearHistory();
const g = await generate(sequence, prompt, decode);
console.log(JSON.stringify({
    engine: "llama.cpp", threads: context.currentThreads, prompt_len: prompt.length,
    decode_steps: decode, prefill_s: g.prefill_s, decode_s: g.decode_s, tokens: g.tokens,
}));
await context.dispose();
await model.dispose();
await llama.dispose();
