// Check(cond): a fuzz target's property check. A failed property aborts (a libFuzzer finding)
// after printing "property failed: <cond> (file:line)", in every build mode (unlike assert).
#pragma once

#include <cstdio>
#include <cstdlib>

#define Check(cond)                                                                     \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      std::fprintf(stderr, "property failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__); \
      std::abort();                                                                     \
    }                                                                                   \
  } while (0)
