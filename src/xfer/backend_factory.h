// Backend selection by a short spec string, for tools and tests:
//   "loopback" | "ucx:tcp" | "ucx:shm" | "libfabric:tcp" | "libfabric:shm"
// Thread-safety: pure function.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "xfer/backend.h"
#include "xfer/fault_backend.h"

namespace kvpush::xfer {

/// Creates the backend named by `spec`. Errors: kInvalidArgument (unknown spec), or the backend's
/// own initialisation error (kUnavailable when the transport does not work on this machine).
Result<std::unique_ptr<Backend>> MakeBackend(const std::string& spec);

/// Fault injection for whole-process tests (`kvpush serve --xfer-fault-plan`, the chaos test):
/// from this call on, MakeBackend wraps every backend it creates in the fault backend with `plan`
/// (nullopt: no wrapping, the default). The spec names and handshake are unchanged, so a peer
/// without faults still matches. Call once at start-up, before any MakeBackend; not thread-safe
/// against concurrent MakeBackend calls.
void SetProcessFaultPlan(std::optional<FaultPlan> plan);

/// The fault controls that every backend MakeBackend wraps shares (made by SetProcessFaultPlan;
/// null without a plan). Lives until the next SetProcessFaultPlan: `kvpush serve` toggles
/// FaultControls::SetBroken on it from its SIGUSR1/SIGUSR2 handlers.
FaultControls* ProcessFaultControls();

/// The specs that MakeBackend understands and that work across processes on one host.
std::vector<std::string> MultiProcessBackendSpecs();

}  // namespace kvpush::xfer
