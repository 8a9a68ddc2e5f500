#include "xfer/backend_factory.h"

#include "xfer/loopback_backend.h"
#include "xfer/ucx_backend.h"

namespace kvpush::xfer {

Result<std::unique_ptr<Backend>> MakeBackend(const std::string& spec) {
  if (spec == "loopback") return MakeLoopbackBackend();
  if (spec.rfind("ucx:", 0) == 0) {
    UcxOptions o;
    o.preset = spec.substr(4);
    return MakeUcxBackend(o);
  }
  return InvalidArgument("unknown backend spec '" + spec +
                         "' (loopback, ucx:tcp, ucx:shm, libfabric:tcp, libfabric:shm)");
}

std::vector<std::string> MultiProcessBackendSpecs() {
  return {"ucx:tcp", "ucx:shm"};
}

}  // namespace kvpush::xfer
