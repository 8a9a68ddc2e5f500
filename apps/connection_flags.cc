#include "apps/connection_flags.h"

namespace kvpush::apps {

void AddConnectionFlags(CLI::App* cmd, http::ConnectionOptions* o) {
  cmd->add_option("--timeout-keep-alive", o->keep_alive_timeout_s,
                  "Seconds an open connection may wait for its next request (after connecting "
                  "or after a response) before it is closed; idle connections hold no thread "
                  "(uvicorn's flag)")
      ->check(CLI::Range(1, 86400))
      ->capture_default_str();
  cmd->add_option("--request-head-timeout-s", o->header_timeout_s,
                  "Seconds a request's head (request line and headers; a TLS handshake too) may "
                  "take from its first byte, and the longest gap in its body; past it: 408 and "
                  "close (slow clients hold no thread)")
      ->check(CLI::Range(1, 86400))
      ->capture_default_str();
  cmd->add_option("--max-connections", o->max_connections,
                  "Open client connections at most; one more gets 503 too_many_connections "
                  "(over TLS: a close) at once. 0: 3/4 of the open-file limit, which is raised "
                  "to its hard limit at start")
      ->capture_default_str();
}

}  // namespace kvpush::apps
