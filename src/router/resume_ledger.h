// ResumeLedger: what a streamed answer delivered of each choice, read from the instance's
// `: kvpush-resume` comment lines, so that the router can continue the stream on another
// instance when the answering one fails (docs/reliability.md, "Continuation").
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace kvpush::router {

/// Takes the `: kvpush-resume {...}` comment line out of one SSE event (as SseSplitter gives
/// it) and returns its JSON text; `*event` keeps the rest, or becomes "" when the comment was
/// all it held (an output with no event for the client). nullopt (event untouched) when it
/// has none. Pure.
std::optional<std::string> TakeResumeInfo(std::string* event);

/// True for the comment-only event `: kvpush-draining` an instance writes on each stream that
/// asked for resume comments when its drain begins: the router may continue the stream elsewhere
/// now instead of waiting for the drain timeout to cut it (docs/reliability.md, "Continuation").
/// Pure.
bool IsDrainOffer(const std::string& event);

/// Per choice index: the token ids relayed so far, the text bytes of them the client got, and
/// whether its finish_reason was relayed. Fed only with the comments of events that were
/// relayed (or swallowed) whole, so it is exactly what the client has. Not thread-safe (the
/// stream's relaying thread owns it).
class ResumeLedger {
 public:
  /// Applies one comment's JSON ({"index", "token_ids", "text_bytes", "finished"} and an
  /// optional integer "seed", written by the instance's StreamResponder). False (nothing applied) when it is malformed: an
  /// instance that writes such a comment cannot be continued from.
  bool Note(const std::string& info);

  /// The `kvpush_resume` member of a continuation's body: {"choices": [{index, token_ids,
  /// text_bytes, finished}, ...]} in index order, and "usage_sent": true once the usage chunk
  /// was relayed.
  nlohmann::json ToJson() const;

  /// Output tokens relayed over all choices.
  int64_t tokens() const;
  /// The indices of the choices not finished that have relayed output, ascending.
  std::vector<int64_t> OpenChoicesWithOutput() const;
  /// The ledger of choice `index` alone, as choice 0 (its tokens, text bytes, finish), with the
  /// same seed; the usage chunk not relayed. Empty (no choice) when `index` has no entry.
  ResumeLedger OneChoice(int64_t index) const;
  /// The seed the instance sampled with (its comments' `seed`; the client's, or the one it drew
  /// for an unseeded request), once a comment named one.
  std::optional<int64_t> seed() const { return seed_; }
  /// A comment was malformed, or an event with choice data came without one (the instance does
  /// not write them: an older version, another server): continuing is unsafe.
  bool broken() const { return broken_; }
  void MarkBroken() { broken_ = true; }
  /// The usage chunk (include_usage) was relayed: a continuation must not send it again
  /// (`usage_sent` in ToJson).
  void NoteUsageRelayed() { usage_sent_ = true; }

 private:
  struct Choice {
    std::vector<int32_t> token_ids;
    int64_t text_bytes = 0;
    bool finished = false;
  };
  std::map<int64_t, Choice> choices_;
  std::optional<int64_t> seed_;
  bool broken_ = false;
  bool usage_sent_ = false;
};

}  // namespace kvpush::router
