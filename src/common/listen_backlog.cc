#include "common/listen_backlog.h"

#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdlib>

namespace kvpush {

int RaiseListenBacklog(int port, int backlog) {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return 0;
  int changed = 0;
  while (dirent* e = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == dirfd(dir)) continue;
    int accepting = 0;
    socklen_t len = sizeof accepting;
    if (getsockopt(static_cast<int>(fd), SOL_SOCKET, SO_ACCEPTCONN, &accepting, &len) != 0 ||
        accepting == 0) {
      continue;
    }
    sockaddr_storage addr{};
    socklen_t alen = sizeof addr;
    if (getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&addr), &alen) != 0) continue;
    int bound = -1;
    if (addr.ss_family == AF_INET) {
      bound = ntohs(reinterpret_cast<const sockaddr_in*>(&addr)->sin_port);
    } else if (addr.ss_family == AF_INET6) {
      bound = ntohs(reinterpret_cast<const sockaddr_in6*>(&addr)->sin6_port);
    }
    if (bound == port && listen(static_cast<int>(fd), backlog) == 0) ++changed;
  }
  closedir(dir);
  return changed;
}

}  // namespace kvpush
