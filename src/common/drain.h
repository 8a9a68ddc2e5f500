// The errors a draining server answers (docs/server.md "Graceful drain", docs/router.md
// "Shutdown"). An instance and the router use the same words, so a client sees the same body
// whichever of the two it talks to.
#pragma once

namespace kvpush {

/// Error code and message of a new completion request (and of GET /health) while a server
/// drains: HTTP 503, type `server_error`. Nothing was done for the request; a router retries it.
inline constexpr const char* kDrainingCode = "draining";
inline constexpr const char* kDrainingMessage =
    "draining: this server is shutting down and takes no new requests";

/// Request header of a migration's P leg (docs/reliability.md, *Migration*): the router asks the
/// instance that holds a stream's context to compute and push it to another one. A draining
/// instance still takes such a leg (it moves its own streams away), and the continuation of a
/// whole answer it handed back (kHandBackCode) when no other instance took it; it refuses the
/// request as draining once parsed when it is neither.
inline constexpr const char* kMigrationSourceHeader = "x-kvpush-migration-source";

/// Error code and message of a request still open when the drain timeout ran out: an SSE error
/// event in a stream, HTTP 503 (type `server_error`) otherwise.
inline constexpr const char* kDrainTimeoutCode = "draining_timeout";
inline constexpr const char* kDrainTimeoutMessage =
    "draining: this server is shutting down and the request did not finish within its drain "
    "timeout (--drain-timeout-s)";

/// Error code and message of a whole (not streamed) answer a draining instance hands back to
/// the router that asked for it (`x-kvpush-resume-info: 1`): HTTP 503, type `server_error`, with
/// the answer so far as `kvpush_resume` (whole: true) and the seed as `kvpush_seed`, which the
/// router continues on another instance (docs/reliability.md, *Continuation*).
inline constexpr const char* kHandBackCode = "draining_handback";
inline constexpr const char* kHandBackMessage =
    "draining: this server is shutting down; the answer so far is handed back to the router, "
    "which finishes it on another instance";

}  // namespace kvpush
