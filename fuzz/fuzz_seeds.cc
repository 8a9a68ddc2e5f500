// Writes seed inputs for the fuzz targets (small valid files the fuzzer mutates):
//   fuzz_seeds <out_dir>  ->  <out_dir>/gguf_fuzz/*.gguf, <out_dir>/spm_encode_fuzz/*.txt, and
//   the peer-input targets' seeds (peer_seeds.h)
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "model/gguf_writer.h"
#include "model/random_model.h"
#include "peer_seeds.h"

int main(int argc, char** argv) {
  using namespace kvpush;
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_seeds OUT_DIR\n");
    return 2;
  }
  const std::filesystem::path out = argv[1];
  std::filesystem::create_directories(out / "gguf_fuzz");
  std::filesystem::create_directories(out / "spm_encode_fuzz");
  int n = 0;
  for (GgmlType type : {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ8_0}) {
    RandomLlamaOptions o;
    o.dim = 32;
    o.layers = 1;
    o.heads = 2;
    o.kv_heads = 1;
    o.hidden_dim = 32;
    o.vocab = 355;
    o.context = 8;
    o.dtype = type;
    o.tied_output = type != GgmlType::kF32;
    // One seed per architecture the loader knows (q/k norms, biases, rope_freqs paths).
    const char* const archs[] = {"llama", "qwen3", "qwen2", "llama3"};
    o.arch = archs[n % 4];
    auto w = BuildRandomLlamaGguf(o);
    if (!w.ok() ||
        !w->WriteFile((out / "gguf_fuzz" / ("model" + std::to_string(n++) + ".gguf")).string())
             .ok()) {
      std::fprintf(stderr, "cannot write seed\n");
      return 1;
    }
  }
  GgufWriter small;
  small.set_alignment(64);
  small.SetString("general.architecture", "llama");
  small.SetStringArray("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "<0x41>", "a"});
  small.SetF32Array("tokenizer.ggml.scores", {0, 0, 0, 0, -1});
  small.SetI32Array("tokenizer.ggml.token_type", {2, 3, 3, 6, 1});
  small.SetString("tokenizer.ggml.model", "llama");
  std::vector<float> v(64, 0.5f);
  (void)small.AddTensor("q", {32, 2}, GgmlType::kQ8_0, v);
  (void)small.AddTensor("h", {64}, GgmlType::kF16, v);
  if (!small.WriteFile((out / "gguf_fuzz" / "small.gguf").string()).ok()) return 1;
  const char* texts[] = {"Once upon a time", "  two  spaces\n",
                         "caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80", "\xFF\xFE bad", ""};
  int t = 0;
  for (const char* s : texts) {
    std::ofstream(out / "spm_encode_fuzz" / ("text" + std::to_string(t++) + ".txt"),
                  std::ios::binary)
        << s;
  }
  if (!WritePeerSeeds(out)) {
    std::fprintf(stderr, "cannot write the peer-input seeds\n");
    return 1;
  }
  return 0;
}
