#include "router/stream_move.h"

namespace kvpush::router {

StreamMove::Step StreamMove::OnMoveWanted(bool pushable) {
  if (state_ != State::kIdle) return Step::kNothing;
  if (!pushable) return Step::kContinueNow;
  state_ = State::kFirstRound;
  round_ok_ = false;
  rounds_ = 1;
  return Step::kStartFirstRound;
}

StreamMove::Step StreamMove::OnFirstRoundNotStarted() {
  state_ = State::kIdle;
  return Step::kContinueNow;
}

StreamMove::Step StreamMove::OnRoundEnded(bool ok, int64_t tail_tokens) {
  if (state_ != State::kFirstRound) return Step::kNothing;
  round_ok_ = ok;
  if (ok && tail_tokens >= kNextRoundTokens && rounds_ < kMaxRounds) {
    ++rounds_;
    return Step::kStartNextRound;
  }
  state_ = State::kReady;
  return Step::kNothing;
}

void StreamMove::OnNextRoundNotStarted() {
  if (state_ != State::kFirstRound) return;
  state_ = State::kReady;
  round_ok_ = true;  // the round before it ended ok: the target holds the context up to there
}

StreamMove::Step StreamMove::OnRelayRound(bool took_events, int64_t silence_ns,
                                          bool can_switch) {
  if (state_ != State::kReady || !can_switch) return Step::kNothing;
  // Right after an event of the old stream went out, the new instance's first token follows
  // one admission later, not up to a decode step later; a silent stream does not wait forever.
  if (!took_events && silence_ns <= kSilenceNs) return Step::kNothing;
  state_ = State::kIdle;
  return round_ok_ ? Step::kSwitchComputingTail : Step::kSwitchPushingAll;
}

void StreamMove::Reset() {
  state_ = State::kIdle;
  round_ok_ = false;
  rounds_ = 0;
}

}  // namespace kvpush::router
