#include "engine/output_processor.h"

#include <algorithm>
#include <utility>

namespace kvpush {

OutputTextProcessor::OutputTextProcessor(const Tokenizer& tokenizer, std::vector<std::string> stop,
                                         std::span<const int32_t> prompt)
    : detok_(tokenizer) {
  for (int32_t t : prompt) detok_.Push(t);  // prime; the prompt's own text is not emitted
  for (auto& s : stop) {
    if (s.empty()) continue;
    holdback_ = std::max(holdback_, s.size() - 1);
    stop_.push_back(std::move(s));
  }
}

OutputTextProcessor::Delta OutputTextProcessor::Append(int32_t token, bool match_stops) {
  if (stopped_) return {};
  pending_ += detok_.Push(token);
  if (!match_stops) floor_ = pending_.size();
  return Scan();
}

OutputTextProcessor::Delta OutputTextProcessor::Scan() {
  Delta d;
  // Earliest match of any stop string in the pending text.
  size_t best = std::string::npos;
  const std::string* which = nullptr;
  for (const auto& s : stop_) {
    const size_t from = floor_ + 1 > s.size() ? floor_ + 1 - s.size() : 0;
    size_t p = pending_.find(s, from);
    if (p != std::string::npos && (best == std::string::npos || p < best)) {
      best = p;
      which = &s;
    }
  }
  if (which != nullptr) {
    d.text = pending_.substr(0, best);
    d.stopped = true;
    d.stop_string = *which;
    pending_.clear();
    stopped_ = true;
    return d;
  }
  if (pending_.size() <= holdback_) return d;
  size_t cut = pending_.size() - holdback_;
  // Do not split a UTF-8 character: move the cut back over continuation bytes.
  while (cut > 0 && cut < pending_.size() &&
         (static_cast<unsigned char>(pending_[cut]) & 0xC0) == 0x80) {
    --cut;
  }
  d.text = pending_.substr(0, cut);
  pending_.erase(0, cut);
  floor_ = floor_ > cut ? floor_ - cut : 0;
  return d;
}

std::string OutputTextProcessor::Flush(bool match_stops) {
  if (stopped_) return {};
  pending_ += detok_.Flush();
  if (!match_stops) floor_ = pending_.size();
  // A stop string may complete only with the flushed bytes.
  Delta d = Scan();
  if (d.stopped) return d.text;
  std::string out = std::move(d.text);
  out += pending_;
  pending_.clear();
  return out;
}

}  // namespace kvpush
