// StreamMove: one stream's move to another decode instance (docs/reliability.md, "Migration")
// as a single-threaded state machine. It is told what happened — a move wanted (an operator's
// ask, a draining instance's offer), the first round's end, what a relay round saw, the switch
// — and answers what to do; RequestFlow (continuation_flow.cc, relay_flow.cc) does it. No clock,
// no I/O: stream_move_test.cc drives it with tables.
#pragma once

#include <cstdint>

namespace kvpush::router {

/// States:
///   kIdle        no move under way (the stream is relayed from its instance);
///   kFirstRound  a pushed move's first round runs: the target takes the context so far from
///                the source while the stream goes on there;
///   kReady       that round ended (ok or not): the stream switches at the next good moment.
/// Not thread-safe: the relaying thread owns it.
class StreamMove {
 public:
  enum class State : uint8_t { kIdle, kFirstRound, kReady };

  /// What the relaying thread does now.
  enum class Step : uint8_t {
    kNothing,          ///< nothing (a move is under way already, or not yet time to switch)
    kStartFirstRound,  ///< start a pushed move's first round (RequestFlow::StartPreCopy)
    kContinueNow,      ///< continue the stream on another instance at once, which computes it
    kSwitchComputingTail,  ///< switch to the first round's target; it computes the tail
    kSwitchPushingAll,     ///< switch to it with the whole context pushed (the round failed)
  };

  /// A stream silent this long after its first round ended switches without waiting for its
  /// next event (ns).
  static constexpr int64_t kSilenceNs = 50'000'000;

  /// A move is wanted. `pushable`: the stream may move by push (P/D, --migration-transfer push,
  /// one choice with output; RequestFlow::PlanPushedMove). kIdle: kStartFirstRound when
  /// pushable, else kContinueNow. Otherwise kNothing (one move at a time).
  Step OnMoveWanted(bool pushable);

  /// The first round could not start (no free target, no worker): kContinueNow, back to kIdle.
  Step OnFirstRoundNotStarted();

  /// The first round's target answered 200 (`ok`) or not. kFirstRound -> kReady; ignored in
  /// other states.
  void OnFirstRoundEnded(bool ok);

  /// A relay round of the old stream: whether it relayed events (`took_events`), how long since
  /// the last one (`silence_ns`), and whether a switch is possible now (`can_switch`: nothing
  /// held back, no terminal event sent, the old stream not ended). In kReady with can_switch
  /// and (took_events or silence_ns > kSilenceNs): the switch (computing the tail after an ok
  /// round, pushing all after a failed one), back to kIdle. Else kNothing.
  Step OnRelayRound(bool took_events, int64_t silence_ns, bool can_switch);

  /// The stream switched or ended for another reason (a failure's continuation, its end): a
  /// move under way is dropped, back to kIdle.
  void Reset();

  State state() const { return state_; }
  bool moving() const { return state_ != State::kIdle; }

 private:
  State state_ = State::kIdle;
  bool round_ok_ = false;
};

}  // namespace kvpush::router
