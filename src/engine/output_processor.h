// OutputTextProcessor: turns a request's generated token ids into text deltas and applies stop
// strings (matched on the detokenized text, excluded from the output, found even when a stop
// string spans several tokens).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "model/tokenizer.h"

namespace kvpush {

/// Per-request text state. Holds back the last (longest stop string - 1) bytes of text so that a
/// stop string that starts in already-produced text is never emitted; the hold-back is cut at a
/// UTF-8 character boundary so every delta is valid UTF-8 (as valid as the detokenizer's output).
/// Not thread-safe: owned by the engine thread, one per request.
class OutputTextProcessor {
 public:
  /// `tokenizer` must outlive this object. Empty stop strings are ignored. The detokenizer is
  /// primed with `prompt` (its text is not emitted), so SentencePiece's dropped leading space
  /// applies only to the first piece of the whole sequence: after a BOS-only prompt the first
  /// generated piece loses its space (llama2.c), after a text prompt it keeps it.
  OutputTextProcessor(const Tokenizer& tokenizer, std::vector<std::string> stop,
                      std::span<const int32_t> prompt = {});

  struct Delta {
    std::string text;         ///< text that became final
    bool stopped = false;     ///< a stop string matched; nothing more may be appended
    std::string stop_string;  ///< which one
  };

  /// Appends one generated token (control tokens such as EOS add no text). With
  /// `match_stops` false (vLLM's min_tokens: the first min_tokens tokens) the token's text is
  /// not searched: a later match must end in text of a later token (it may start earlier).
  Delta Append(int32_t token, bool match_stops = true);

  /// Ends the stream: returns every held-back byte plus the detokenizer's pending bytes.
  /// (Nothing after a stop string match.) `match_stops` as for Append, for the pending bytes.
  std::string Flush(bool match_stops = true);

 private:
  Delta Scan();

  StreamingDetokenizer detok_;
  std::vector<std::string> stop_;
  size_t holdback_ = 0;  ///< longest stop string - 1
  std::string pending_;  ///< text produced but not yet emitted
  size_t floor_ = 0;     ///< a stop match must end after pending_[0, floor_) (min_tokens text)
  bool stopped_ = false;
};

}  // namespace kvpush
