// Loopback backend: agents in the same process, data moved with memcpy on a worker thread.
//
// Used by tests (with the fault decorator) and for colocated prefill+decode. Addressing is by
// offset; keys are small ids issued by the target backend, and every op is bounds-checked on the
// target side as well. A peer whose backend was destroyed is reported as kPeerGone.
// Thread-safety: as Backend; one worker thread per backend, idle without burning CPU.
#pragma once

#include <memory>

#include "xfer/backend.h"

namespace kvpush::xfer {

/// Creates a loopback backend. Never fails.
std::unique_ptr<Backend> MakeLoopbackBackend();

}  // namespace kvpush::xfer
