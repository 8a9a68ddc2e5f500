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
///   kFirstRound  a pushed move's round runs (the first, or up to kMaxRounds - 1 more): the
///                target takes the context so far from the source while the stream goes on;
///   kReady       the last round ended (ok or not): the stream switches at the next good moment.
/// Not thread-safe: the relaying thread owns it.
class StreamMove {
 public:
  enum class State : uint8_t { kIdle, kFirstRound, kReady };

  /// What the relaying thread does now.
  enum class Step : uint8_t {
    kNothing,          ///< nothing (a move is under way already, or not yet time to switch)
    kStartFirstRound,  ///< start a pushed move's first round (RequestFlow::StartPreCopy)
    kStartNextRound,   ///< start one more round to the same target (RequestFlow::NextRound)
    kContinueNow,      ///< continue the stream on another instance at once, which computes it
    kSwitchComputingTail,  ///< switch to the first round's target; it computes the tail
    kSwitchPushingAll,     ///< switch to it with the whole context pushed (the round failed)
  };

  /// A stream silent this long after its first round ended switches without waiting for its
  /// next event (ns).
  static constexpr int64_t kSilenceNs = 50'000'000;
  /// A round whose tail per sequence reached this many tokens (a block of the default size:
  /// at least one whole block the target lacks) is followed by another.
  static constexpr int64_t kNextRoundTokens = 16;
  /// Rounds at most, the first included: a stream decoding faster than rounds end still
  /// switches.
  static constexpr int kMaxRounds = 3;

  /// A move is wanted. `pushable`: the stream may move by push (P/D, --migration-transfer push,
  /// a choice with output; pushed_move.h). kIdle: kStartFirstRound when
  /// pushable, else kContinueNow. Otherwise kNothing (one move at a time).
  Step OnMoveWanted(bool pushable);

  /// The first round could not start (no free target, no worker): kContinueNow, back to kIdle.
  Step OnFirstRoundNotStarted();

  /// A round's target answered 200 for every sequence (`ok`) or not; `tail_tokens`: the output
  /// tokens per sequence the source streamed since that round began (what the target would
  /// compute at the switch, besides the unfinished block). In kFirstRound: after an ok round
  /// whose tail is kNextRoundTokens or more, while fewer than kMaxRounds rounds ran,
  /// kStartNextRound (another round from the stream's current output: the target's prefix
  /// cache holds the context up to this round's start, so only the blocks filled since move);
  /// else -> kReady and kNothing. Ignored (kNothing) in other states.
  Step OnRoundEnded(bool ok, int64_t tail_tokens);

  /// The next round could not start (no worker): kReady after the last ok round.
  void OnNextRoundNotStarted();

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
  int rounds_ = 0;  ///< rounds started in this move
};

}  // namespace kvpush::router
