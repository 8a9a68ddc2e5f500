// StreamRegistry: the router's streams in flight that may go on on another instance, by request
// id, so that an operator can move one (POST /admin/migrate, docs/router.md): the move is asked
// here and carried out by the thread relaying the stream (RequestFlow::Pump).
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "common/mutex.h"
#include "common/thread_annotations.h"

namespace kvpush::router {

/// What an asked move came to.
struct MoveOutcome {
  bool moved = false;
  std::string from, to;  ///< instance URLs (to: set when moved)
  std::string error;     ///< why not, when !moved
};

/// One stream's move request, between the operator's thread (Ask) and the relaying thread
/// (Asked, Answer). Thread-safe.
class MoveSlot {
 public:
  /// Asks for the move and waits at most `timeout` for the relaying thread's answer; nullopt
  /// when none came (the stream ended, or did not pump, meanwhile). One ask at a time: a
  /// second concurrent Ask returns an outcome saying so at once.
  std::optional<MoveOutcome> Ask(std::chrono::milliseconds timeout);
  /// The relaying thread: true when a move was asked and not answered yet.
  bool Asked();
  /// The relaying thread answers the ask (wakes Ask).
  void Answer(MoveOutcome outcome);
  /// The stream ended: a pending ask is answered with `why`.
  void Close(const std::string& why);

 private:
  Mutex mu_;
  CondVar cv_;
  bool asked_ GUARDED_BY(mu_) = false;
  bool closed_ GUARDED_BY(mu_) = false;
  std::optional<MoveOutcome> outcome_ GUARDED_BY(mu_);
};

/// Streams by request id (the latest one when a client reuses an id). Thread-safe.
class StreamRegistry {
 public:
  void Add(const std::string& request_id, const std::shared_ptr<MoveSlot>& slot);
  /// Removes `slot` (only if it is still the one registered under `request_id`).
  void Remove(const std::string& request_id, const MoveSlot* slot);
  /// The stream's slot, or null when none is in flight under that id.
  std::shared_ptr<MoveSlot> Find(const std::string& request_id);

 private:
  Mutex mu_;
  std::map<std::string, std::weak_ptr<MoveSlot>> slots_ GUARDED_BY(mu_);
};

}  // namespace kvpush::router
