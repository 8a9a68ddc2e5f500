// ReadHfTokenizerJson / WriteBpeVocab (model/hf_vocab.h).
#include "model/hf_vocab.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace kvpush {

namespace {

Result<nlohmann::json> ReadJson(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("cannot open '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  auto j = nlohmann::json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgument("'" + path + "' is not valid JSON");
  return j;
}

/// A config token entry: a string or {"content": ...}; "" when absent or null.
std::string ConfigToken(const nlohmann::json& config, const char* key) {
  if (!config.contains(key)) return "";
  const auto& v = config[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) {
    return v["content"].get<std::string>();
  }
  return "";
}

Status ReadMerges(const nlohmann::json& merges, std::vector<std::string>& out) {
  if (!merges.is_array()) return InvalidArgument("tokenizer.json: model.merges is not an array");
  out.reserve(merges.size());
  for (const auto& m : merges) {
    if (m.is_string()) {
      out.push_back(m.get<std::string>());
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      out.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
    } else {
      return InvalidArgument("tokenizer.json: a merge is neither \"a b\" nor [a, b]");
    }
  }
  return Status::Ok();
}

}  // namespace

Status CheckVocabFamily(const std::string& arch) {
  if (arch == "qwen3" || arch == "qwen2" || arch == "llama3") return Status::Ok();
  return InvalidArgument("--arch must be qwen3, qwen2 or llama3, not '" + arch + "'");
}

Result<HfVocab> ReadHfTokenizerJson(const std::string& path, const std::string& arch) {
  KVP_RETURN_IF_ERROR(CheckVocabFamily(arch));
  KVP_ASSIGN_OR_RETURN(nlohmann::json tj, ReadJson(path));
  if (!tj.contains("model") || !tj["model"].is_object() || tj["model"].value("type", "") != "BPE") {
    return InvalidArgument("'" + path + "' has no byte-level BPE model (model.type != \"BPE\")");
  }
  const auto& model = tj["model"];
  if (!model.contains("vocab") || !model["vocab"].is_object()) {
    return InvalidArgument("tokenizer.json: model.vocab is not an object");
  }
  std::vector<std::pair<std::string, int64_t>> entries;
  for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) {
    if (!it.value().is_number_integer())
      return InvalidArgument("tokenizer.json: a vocab id is not an integer");
    entries.emplace_back(it.key(), it.value().get<int64_t>());
  }
  std::vector<std::tuple<std::string, int64_t, bool>> added;
  if (tj.contains("added_tokens") && tj["added_tokens"].is_array()) {
    for (const auto& a : tj["added_tokens"]) {
      if (!a.contains("id") || !a["id"].is_number_integer() || !a.contains("content") ||
          !a["content"].is_string()) {
        return InvalidArgument("tokenizer.json: an added token lacks id or content");
      }
      added.emplace_back(a["content"].get<std::string>(), a["id"].get<int64_t>(),
                         a.value("special", false));
    }
  }
  int64_t n = 0;
  for (const auto& e : entries) n = std::max(n, e.second + 1);
  for (const auto& a : added) n = std::max(n, std::get<1>(a) + 1);
  if (n <= 0 || n > (int64_t{1} << 24))
    return InvalidArgument("tokenizer.json: vocabulary size " + std::to_string(n));
  HfVocab out;
  BpeVocab& v = out.vocab;
  v.pieces.assign(static_cast<size_t>(n), std::string());
  v.types.assign(static_cast<size_t>(n), TokenType::kUnused);
  for (const auto& [piece, id] : entries) {
    if (id < 0) return InvalidArgument("tokenizer.json: negative id");
    v.pieces[static_cast<size_t>(id)] = piece;
    v.types[static_cast<size_t>(id)] = TokenType::kNormal;
  }
  for (const auto& [content, id, special] : added) {
    if (id < 0) return InvalidArgument("tokenizer.json: negative id");
    v.pieces[static_cast<size_t>(id)] = content;
    v.types[static_cast<size_t>(id)] = special ? TokenType::kControl : TokenType::kUserDefined;
  }
  for (int64_t id = 0; id < n; ++id) {
    if (v.types[static_cast<size_t>(id)] == TokenType::kUnused) {
      v.pieces[static_cast<size_t>(id)] = "[PAD" + std::to_string(id) + "]";
    }
  }
  KVP_RETURN_IF_ERROR(
      ReadMerges(model.contains("merges") ? model["merges"] : nlohmann::json(), v.merges));

  const bool llama = arch == "llama3";
  v.pre = llama ? "llama-bpe" : "qwen2";
  v.add_bos = llama;
  std::string bos = llama ? "<|begin_of_text|>" : "<|endoftext|>";
  std::string eos = llama ? "<|end_of_text|>" : "<|endoftext|>";
  const auto config_path = std::filesystem::path(path).parent_path() / "tokenizer_config.json";
  if (std::filesystem::exists(config_path)) {
    KVP_ASSIGN_OR_RETURN(nlohmann::json cj, ReadJson(config_path.string()));
    if (std::string b = ConfigToken(cj, "bos_token"); !b.empty()) bos = b;
    if (std::string e = ConfigToken(cj, "eos_token"); !e.empty()) eos = e;
    if (cj.contains("add_bos_token") && cj["add_bos_token"].is_boolean()) {
      v.add_bos = cj["add_bos_token"].get<bool>();
    }
    if (cj.contains("chat_template") && cj["chat_template"].is_string()) {
      out.chat_template = cj["chat_template"].get<std::string>();
    }
  }
  auto find = [&](const std::string& piece) -> int32_t {
    for (size_t id = 0; id < v.pieces.size(); ++id) {
      if (v.pieces[id] == piece && v.types[id] != TokenType::kUnused)
        return static_cast<int32_t>(id);
    }
    return -1;
  };
  v.bos_id = find(bos);
  v.eos_id = find(eos);
  if (v.bos_id < 0 || v.eos_id < 0) {
    return InvalidArgument("tokenizer.json: BOS '" + bos + "' or EOS '" + eos + "' is not a token");
  }
  return out;
}

void WriteBpeVocab(const HfVocab& hv, GgufWriter& w) {
  const BpeVocab& v = hv.vocab;
  w.SetString("tokenizer.ggml.model", "gpt2");
  w.SetString("tokenizer.ggml.pre", v.pre);
  w.SetStringArray("tokenizer.ggml.tokens", v.pieces);
  std::vector<int32_t> types;
  types.reserve(v.types.size());
  for (TokenType t : v.types) types.push_back(static_cast<int32_t>(t));
  w.SetI32Array("tokenizer.ggml.token_type", types);
  w.SetStringArray("tokenizer.ggml.merges", v.merges);
  w.SetU32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(v.bos_id));
  w.SetU32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(v.eos_id));
  w.SetBool("tokenizer.ggml.add_bos_token", v.add_bos);
  if (!hv.chat_template.empty()) w.SetString("tokenizer.chat_template", hv.chat_template);
}

}  // namespace kvpush
