#include "router/resume_ledger.h"

#include <string_view>

#include "common/json_parse.h"

namespace kvpush::router {

namespace {
constexpr std::string_view kTag = ": kvpush-resume ";
}  // namespace

std::optional<std::string> TakeResumeInfo(std::string* event) {
  std::string& e = *event;
  size_t start = std::string::npos;
  if (e.compare(0, kTag.size(), kTag) == 0) {
    start = 0;
  } else {
    const size_t at = e.find(std::string("\n") + std::string(kTag));
    if (at != std::string::npos) start = at + 1;
  }
  if (start == std::string::npos) return std::nullopt;
  const size_t end = e.find('\n', start);
  if (end == std::string::npos) return std::nullopt;  // SseSplitter's events end in a blank line
  std::string info = e.substr(start + kTag.size(), end - start - kTag.size());
  if (!info.empty() && info.back() == '\r') info.pop_back();
  e.erase(start, end + 1 - start);
  // Only the event's blank line left: the comment was the whole event.
  if (e.find_first_not_of("\r\n") == std::string::npos) e.clear();
  return info;
}

bool IsDrainOffer(const std::string& event) {
  static constexpr std::string_view kOffer = ": kvpush-draining";
  return event.compare(0, kOffer.size(), kOffer) == 0 &&
         event.find_first_not_of("\r\n", kOffer.size()) == std::string::npos;
}

bool ResumeLedger::Note(const std::string& info) {
  const nlohmann::json j = ParseJson(info);
  auto bad = [this] {
    broken_ = true;
    return false;
  };
  if (!j.is_object()) return bad();
  const auto index = j.find("index");
  const auto ids = j.find("token_ids");
  const auto bytes = j.find("text_bytes");
  const auto finished = j.find("finished");
  if (index == j.end() || !index->is_number_unsigned() || ids == j.end() || !ids->is_array() ||
      bytes == j.end() || !bytes->is_number_unsigned() || finished == j.end() ||
      !finished->is_boolean()) {
    return bad();
  }
  const auto seed = j.find("seed");
  if (seed != j.end() && !seed->is_number_integer()) return bad();
  if (seed != j.end()) seed_ = seed->get<int64_t>();
  Choice& c = choices_[index->get<int64_t>()];
  for (const auto& id : *ids) {
    if (!id.is_number_unsigned() || id.get<uint64_t>() > 0x7fffffffull) return bad();
    c.token_ids.push_back(id.get<int32_t>());
  }
  c.text_bytes = bytes->get<int64_t>();
  c.finished = c.finished || finished->get<bool>();
  return true;
}

nlohmann::json ResumeLedger::ToJson() const {
  nlohmann::json arr = nlohmann::json::array();
  for (const auto& [index, c] : choices_) {
    arr.push_back({{"index", index},
                   {"token_ids", c.token_ids},
                   {"text_bytes", c.text_bytes},
                   {"finished", c.finished}});
  }
  nlohmann::json out = {{"choices", std::move(arr)}};
  if (usage_sent_) out["usage_sent"] = true;
  return out;
}

int64_t ResumeLedger::tokens() const {
  int64_t n = 0;
  for (const auto& [index, c] : choices_) n += static_cast<int64_t>(c.token_ids.size());
  return n;
}

std::vector<int64_t> ResumeLedger::OpenChoicesWithOutput() const {
  std::vector<int64_t> out;
  for (const auto& [index, c] : choices_) {
    if (!c.finished && !c.token_ids.empty()) out.push_back(index);
  }
  return out;
}

ResumeLedger ResumeLedger::OneChoice(int64_t index) const {
  ResumeLedger one;
  one.seed_ = seed_;
  one.broken_ = broken_;
  const auto it = choices_.find(index);
  if (it != choices_.end()) one.choices_[0] = it->second;
  return one;
}

}  // namespace kvpush::router
