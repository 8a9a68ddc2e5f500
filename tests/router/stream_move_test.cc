// StreamMove (src/router/stream_move.h): every state x input of a stream's move, as tables.
#include "router/stream_move.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

namespace kvpush::router {
namespace {

using State = StreamMove::State;
using Step = StreamMove::Step;

const char* Name(State s) {
  switch (s) {
    case State::kIdle: return "idle";
    case State::kFirstRound: return "first_round";
    case State::kReady: return "ready";
  }
  return "?";
}

/// A machine brought to `s` (a first round that ended `ok` for kReady).
StreamMove In(State s, bool ok = true) {
  StreamMove m;
  if (s == State::kIdle) return m;
  EXPECT_EQ(m.OnMoveWanted(true), Step::kStartFirstRound);
  if (s == State::kReady) {
    EXPECT_EQ(m.OnRoundEnded(ok, 0), Step::kNothing);
  }
  EXPECT_EQ(m.state(), s);
  return m;
}

// A move wanted (an operator's ask, a drain's offer): started once, never twice at a time.
TEST(StreamMove, AMoveWantedStartsAFirstRoundOrContinuesAtOnceButNeverTwoAtATime) {
  struct Case {
    State from;
    bool pushable;
    Step step;
    State to;
  };
  const Case cases[] = {
      {State::kIdle, true, Step::kStartFirstRound, State::kFirstRound},
      {State::kIdle, false, Step::kContinueNow, State::kIdle},
      {State::kFirstRound, true, Step::kNothing, State::kFirstRound},
      {State::kFirstRound, false, Step::kNothing, State::kFirstRound},
      {State::kReady, true, Step::kNothing, State::kReady},
      {State::kReady, false, Step::kNothing, State::kReady},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(Name(c.from)) + (c.pushable ? " pushable" : " not pushable"));
    StreamMove m = In(c.from);
    EXPECT_EQ(m.OnMoveWanted(c.pushable), c.step);
    EXPECT_EQ(m.state(), c.to);
  }
  // A first round that could not start (no free target): continue now, idle again.
  StreamMove m = In(State::kFirstRound);
  EXPECT_EQ(m.OnFirstRoundNotStarted(), Step::kContinueNow);
  EXPECT_EQ(m.state(), State::kIdle);
  EXPECT_FALSE(m.moving());
}

// A round's end with a short tail moves kFirstRound to kReady only; a late report after a
// reset (the stream switched for another reason) changes nothing.
TEST(StreamMove, TheFirstRoundsEndCountsOnlyWhileItRuns) {
  for (bool ok : {true, false}) {
    StreamMove m = In(State::kFirstRound);
    EXPECT_EQ(m.OnRoundEnded(ok, 0), Step::kNothing);
    EXPECT_EQ(m.state(), State::kReady);
    EXPECT_EQ(m.OnRoundEnded(!ok, 99), Step::kNothing);  // a second report is ignored
    EXPECT_EQ(m.OnRelayRound(true, 0, true),
              ok ? Step::kSwitchComputingTail : Step::kSwitchPushingAll);
  }
  StreamMove idle;
  EXPECT_EQ(idle.OnRoundEnded(true, 99), Step::kNothing);
  EXPECT_EQ(idle.state(), State::kIdle);
  StreamMove reset = In(State::kFirstRound);
  reset.Reset();
  EXPECT_EQ(reset.OnRoundEnded(true, 99), Step::kNothing);
  EXPECT_EQ(reset.state(), State::kIdle);
  EXPECT_EQ(reset.OnRelayRound(true, 0, true), Step::kNothing);
}

// A round that ended ok with a tail of a block or more is followed by another (from the output
// now), up to kMaxRounds in all; a failed round, a short tail or the last round allowed ends
// the rounds (kReady). A next round that cannot start leaves the move ready to switch,
// computing the tail (the round before it ended ok).
TEST(StreamMove, ALongTailAfterAnOkRoundStartsAnotherRoundUpToTheLimit) {
  const int64_t block = StreamMove::kNextRoundTokens;
  struct Case {
    const char* what;
    int rounds_before;  // ok rounds with a long tail before the one that ends
    bool ok;
    int64_t tail;
    Step step;
    State to;
  };
  const Case cases[] = {
      {"first, ok, short tail", 0, true, block - 1, Step::kNothing, State::kReady},
      {"first, ok, a block's tail", 0, true, block, Step::kStartNextRound, State::kFirstRound},
      {"first, failed, long tail", 0, false, 5 * block, Step::kNothing, State::kReady},
      {"second, ok, long tail", 1, true, 5 * block, Step::kStartNextRound, State::kFirstRound},
      {"last allowed, ok, long tail", StreamMove::kMaxRounds - 1, true, 5 * block,
       Step::kNothing, State::kReady},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    StreamMove m = In(State::kFirstRound);
    for (int i = 0; i < c.rounds_before; ++i) {
      ASSERT_EQ(m.OnRoundEnded(true, 2 * block), Step::kStartNextRound);
    }
    EXPECT_EQ(m.OnRoundEnded(c.ok, c.tail), c.step);
    EXPECT_EQ(m.state(), c.to);
    if (c.to == State::kReady) {
      EXPECT_EQ(m.OnRelayRound(true, 0, true),
                c.ok ? Step::kSwitchComputingTail : Step::kSwitchPushingAll);
    } else {
      EXPECT_EQ(m.OnRelayRound(true, 0, true), Step::kNothing);  // no switch mid-round
    }
  }
  StreamMove m = In(State::kFirstRound);
  ASSERT_EQ(m.OnRoundEnded(true, block), Step::kStartNextRound);
  m.OnNextRoundNotStarted();
  EXPECT_EQ(m.state(), State::kReady);
  EXPECT_EQ(m.OnRelayRound(true, 0, true), Step::kSwitchComputingTail);
  // A move after a reset counts its rounds afresh.
  StreamMove again = In(State::kFirstRound);
  for (int i = 1; i < StreamMove::kMaxRounds; ++i) {
    ASSERT_EQ(again.OnRoundEnded(true, block), Step::kStartNextRound);
  }
  again.Reset();
  ASSERT_EQ(again.OnMoveWanted(true), Step::kStartFirstRound);
  EXPECT_EQ(again.OnRoundEnded(true, block), Step::kStartNextRound);
}

// When the stream switches: only once the first round ended, only when a switch is possible,
// and right after an event went out or after a silence; how: the tail computed after an ok
// round, the whole context pushed after a failed one.
TEST(StreamMove, TheSwitchWaitsForTheRoundAnEventOrASilence) {
  const int64_t quiet = StreamMove::kSilenceNs;
  struct Case {
    const char* what;
    State from;
    bool ok;
    bool took_events;
    int64_t silence_ns;
    bool can_switch;
    Step step;
  };
  const Case cases[] = {
      {"idle", State::kIdle, true, true, 0, true, Step::kNothing},
      {"round running", State::kFirstRound, true, true, 0, true, Step::kNothing},
      {"round running, silent", State::kFirstRound, true, false, quiet + 1, true, Step::kNothing},
      {"ok, after an event", State::kReady, true, true, 0, true, Step::kSwitchComputingTail},
      {"failed, after an event", State::kReady, false, true, 0, true, Step::kSwitchPushingAll},
      {"ok, between events", State::kReady, true, false, quiet, true, Step::kNothing},
      {"ok, silent", State::kReady, true, false, quiet + 1, true, Step::kSwitchComputingTail},
      {"failed, silent", State::kReady, false, false, quiet + 1, true, Step::kSwitchPushingAll},
      {"ok, cannot switch (held, ended)", State::kReady, true, true, 0, false, Step::kNothing},
      {"ok, silent, cannot switch", State::kReady, true, false, quiet + 1, false,
       Step::kNothing},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    StreamMove m = In(c.from, c.ok);
    const State before = m.state();
    const Step step = m.OnRelayRound(c.took_events, c.silence_ns, c.can_switch);
    EXPECT_EQ(step, c.step);
    // A switch ends the move; anything else leaves the state as it was.
    EXPECT_EQ(m.state(), step == Step::kNothing ? before : State::kIdle);
  }
}

// A whole move, and the next one after it: the machine is reusable.
TEST(StreamMove, OneMoveAfterAnother) {
  StreamMove m;
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(m.OnMoveWanted(true), Step::kStartFirstRound);
    EXPECT_EQ(m.OnRelayRound(true, 0, true), Step::kNothing);
    EXPECT_EQ(m.OnRoundEnded(i == 0, 0), Step::kNothing);
    EXPECT_EQ(m.OnRelayRound(false, 0, true), Step::kNothing);
    EXPECT_EQ(m.OnRelayRound(true, 0, true),
              i == 0 ? Step::kSwitchComputingTail : Step::kSwitchPushingAll);
    EXPECT_FALSE(m.moving());
  }
}

}  // namespace
}  // namespace kvpush::router
