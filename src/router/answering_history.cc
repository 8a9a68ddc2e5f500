#include "router/answering_history.h"

#include <algorithm>

namespace kvpush::router {

void AnsweringHistory::NoteFailed(const std::string& url) {
  ++failures_;
  if (!FailedOn(url)) failed_.push_back(url);
}

void AnsweringHistory::NoteMovedFrom(const std::string& /*url*/) {
  ++moves_;
}

bool AnsweringHistory::FailedOn(const std::string& url) const {
  return std::find(failed_.begin(), failed_.end(), url) != failed_.end();
}

std::vector<std::string> AnsweringHistory::Excluded(const std::vector<std::string>& refused,
                                                    const std::string& answering) const {
  std::vector<std::string> out;
  auto add = [&out](const std::string& url) {
    if (!url.empty() && std::find(out.begin(), out.end(), url) == out.end()) out.push_back(url);
  };
  for (const std::string& url : refused) add(url);
  for (const std::string& url : failed_) add(url);
  add(answering);
  return out;
}

}  // namespace kvpush::router
