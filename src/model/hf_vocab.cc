// ReadHfTokenizerJson / WriteBpeVocab (model/hf_vocab.h).
#include "model/hf_vocab.h"

#include <algorithm>
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

namespace {

/// Pieces and types by id from model.vocab and added_tokens (see ReadHfTokenizerJson).
Status ReadPieces(const nlohmann::json& tj, BpeVocab& v) {
  const auto& model = tj["model"];
  if (!model.contains("vocab") || !model["vocab"].is_object()) {
    return InvalidArgument("tokenizer.json: model.vocab is not an object");
  }
  struct Entry {
    std::string piece;
    int64_t id;
    TokenType type;
  };
  std::vector<Entry> entries;
  for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) {
    if (!it.value().is_number_integer()) {
      return InvalidArgument("tokenizer.json: the id of '" + it.key() + "' is not an integer");
    }
    entries.push_back({it.key(), it.value().get<int64_t>(), TokenType::kNormal});
  }
  if (tj.contains("added_tokens") && tj["added_tokens"].is_array()) {
    for (const auto& a : tj["added_tokens"]) {
      if (!a.contains("id") || !a["id"].is_number_integer() || !a.contains("content") ||
          !a["content"].is_string()) {
        return InvalidArgument("tokenizer.json: an added token lacks id or content");
      }
      const std::string content = a["content"].get<std::string>();
      // llama.cpp's converter also makes control tokens of non-special ones that look special.
      const bool looks_special =
          content.size() >= 4 && content.starts_with("<|") && content.ends_with("|>");
      const bool special = a.value("special", false) || looks_special;
      entries.push_back({content, a["id"].get<int64_t>(),
                         special ? TokenType::kControl : TokenType::kUserDefined});
    }
  }
  int64_t n = 0;
  for (const Entry& e : entries) {
    if (e.id < 0 || e.id >= (int64_t{1} << 24)) {
      return InvalidArgument("tokenizer.json: id " + std::to_string(e.id) + " out of range");
    }
    n = std::max(n, e.id + 1);
  }
  if (n == 0) return InvalidArgument("tokenizer.json: empty vocabulary");
  v.pieces.assign(static_cast<size_t>(n), std::string());
  v.types.assign(static_cast<size_t>(n), TokenType::kUnused);
  for (Entry& e : entries) {  // added tokens come last, so they win over a vocab entry
    v.pieces[static_cast<size_t>(e.id)] = std::move(e.piece);
    v.types[static_cast<size_t>(e.id)] = e.type;
  }
  for (size_t id = 0; id < v.pieces.size(); ++id) {
    if (v.types[id] == TokenType::kUnused) v.pieces[id] = "[PAD" + std::to_string(id) + "]";
  }
  return Status::Ok();
}

/// BOS/EOS, add_bos and the chat template: family defaults, then tokenizer_config.json.
Status ReadSpecials(const std::string& tokenizer_json_path, const std::string& arch, HfVocab& out) {
  BpeVocab& v = out.vocab;
  const bool llama = arch == "llama3";
  v.pre = llama ? "llama-bpe" : "qwen2";
  v.add_bos = llama;
  std::string bos = llama ? "<|begin_of_text|>" : "<|endoftext|>";
  std::string eos = llama ? "<|end_of_text|>" : "<|endoftext|>";
  const auto config_path =
      std::filesystem::path(tokenizer_json_path).parent_path() / "tokenizer_config.json";
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
  auto find = [&v](const std::string& piece) -> int32_t {
    for (size_t id = 0; id < v.pieces.size(); ++id) {
      if (v.pieces[id] == piece && v.types[id] != TokenType::kUnused) {
        return static_cast<int32_t>(id);
      }
    }
    return -1;
  };
  v.bos_id = find(bos);
  v.eos_id = find(eos);
  if (v.bos_id < 0 || v.eos_id < 0) {
    return InvalidArgument("tokenizer.json: BOS '" + bos + "' or EOS '" + eos + "' is not a token");
  }
  return Status::Ok();
}

}  // namespace

Result<HfVocab> ReadHfTokenizerJson(const std::string& path, const std::string& arch) {
  KVP_RETURN_IF_ERROR(CheckVocabFamily(arch));
  KVP_ASSIGN_OR_RETURN(nlohmann::json tj, ReadJson(path));
  if (!tj.is_object() || !tj.contains("model") || !tj["model"].is_object() ||
      tj["model"].value("type", "") != "BPE") {
    return InvalidArgument("'" + path + "' has no byte-level BPE model (model.type != \"BPE\")");
  }
  HfVocab out;
  KVP_RETURN_IF_ERROR(ReadPieces(tj, out.vocab));
  const auto& model = tj["model"];
  KVP_RETURN_IF_ERROR(
      ReadMerges(model.contains("merges") ? model["merges"] : nlohmann::json(), out.vocab.merges));
  KVP_RETURN_IF_ERROR(ReadSpecials(path, arch, out));
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
