#include "xfer/backend_factory.h"

#include "xfer/libfabric_backend.h"
#include "xfer/loopback_backend.h"
#include "xfer/ucx_backend.h"

namespace kvpush::xfer {
namespace {

/// The process's fault controls (SetProcessFaultPlan); null: no fault injection.
std::shared_ptr<FaultControls>& ProcessControls() {
  static std::shared_ptr<FaultControls> controls;
  return controls;
}

Result<std::unique_ptr<Backend>> MakePlainBackend(const std::string& spec) {
  if (spec == "loopback") return MakeLoopbackBackend();
  if (spec.rfind("ucx:", 0) == 0) {
    UcxOptions o;
    o.preset = spec.substr(4);
    return MakeUcxBackend(o);
  }
  if (spec == "libfabric:tcp" || spec == "libfabric:shm") {
    LibfabricOptions o;
    o.provider = spec == "libfabric:tcp" ? "tcp;ofi_rxm" : "shm";
    return MakeLibfabricBackend(o);
  }
  return InvalidArgument("unknown backend spec '" + spec +
                         "' (loopback, ucx:tcp, ucx:shm, libfabric:tcp, libfabric:shm)");
}

}  // namespace

void SetProcessFaultPlan(std::optional<FaultPlan> plan) {
  if (!plan) {
    ProcessControls().reset();
    return;
  }
  ProcessControls() = std::make_shared<FaultControls>();
  ProcessControls()->Set(*plan);
}

FaultControls* ProcessFaultControls() {
  return ProcessControls().get();
}

Result<std::unique_ptr<Backend>> MakeBackend(const std::string& spec) {
  KVP_ASSIGN_OR_RETURN(auto backend, MakePlainBackend(spec));
  if (!ProcessControls()) return backend;
  return MakeFaultBackend(std::move(backend), ProcessControls());
}

std::vector<std::string> MultiProcessBackendSpecs() {
  return {"ucx:tcp", "ucx:shm", "libfabric:tcp", "libfabric:shm"};
}

}  // namespace kvpush::xfer
