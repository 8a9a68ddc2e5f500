// AnsweringHistory (router/answering_history.h): a move is not a failure.
#include "router/answering_history.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace kvpush::router {
namespace {

using Urls = std::vector<std::string>;

// Each row: what happened to the request, in order ("F url": failed on it, "M url": moved away
// from it), then the instances its next continuation away from `answering` may not go to.
TEST(AnsweringHistory, AContinuationNeverReturnsToAFailureButMayReturnToAMove) {
  struct Row {
    const char* what;
    std::vector<std::pair<char, std::string>> events;
    Urls refused;
    std::string answering;
    Urls excluded;
    int failures, moves;
  } rows[] = {
      {"nothing yet", {}, {}, "A", {"A"}, 0, 0},
      {"moved A->B, B fails: back to A", {{'M', "A"}}, {}, "B", {"B"}, 0, 1},
      {"three moves over A, B, C", {{'M', "A"}, {'M', "B"}}, {}, "C", {"C"}, 0, 2},
      {"A failed, then B moved away", {{'F', "A"}, {'M', "B"}}, {}, "C", {"A", "C"}, 1, 1},
      {"failed on A twice (restarted): listed once",
       {{'F', "A"}, {'F', "A"}},
       {},
       "B",
       {"A", "B"},
       2,
       0},
      {"refused first, then failures", {{'F', "B"}}, {"R"}, "C", {"R", "B", "C"}, 1, 0},
      {"the answering one failed already", {{'F', "A"}}, {"A"}, "A", {"A"}, 1, 0},
      {"no answering instance", {{'F', "A"}}, {}, "", {"A"}, 1, 0},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(row.what);
    AnsweringHistory h;
    for (const auto& [kind, url] : row.events) {
      if (kind == 'F') {
        h.NoteFailed(url);
      } else {
        h.NoteMovedFrom(url);
      }
    }
    EXPECT_EQ(h.Excluded(row.refused, row.answering), row.excluded);
    EXPECT_EQ(h.failures(), row.failures);
    EXPECT_EQ(h.moves(), row.moves);
    for (const auto& [kind, url] : row.events) {
      bool failed = false;
      for (const auto& [k, u] : row.events) failed = failed || (k == 'F' && u == url);
      EXPECT_EQ(h.FailedOn(url), failed) << url;
    }
  }
  AnsweringHistory moved;
  moved.NoteMovedFrom("A");
  EXPECT_FALSE(moved.FailedOn("A"));
  moved.NoteFailed("A");
  EXPECT_TRUE(moved.FailedOn("A"));
}

}  // namespace
}  // namespace kvpush::router
