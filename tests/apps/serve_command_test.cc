// The kvpush binary's `serve` and `generate` subcommands (spawned from KVPUSH_BINARY_DIR):
// refusals at start, the reference story through `generate`, and a served request + clean
// SIGTERM shutdown. Skips when the binary or the shared model is absent.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "server/server_test_util.h"
#include "test_util.h"

namespace kvpush::testing {
namespace {

const std::string kBinary = KVPUSH_BINARY_DIR "/apps/kvpush";

/// A spawned kvpush process with stdout captured through a pipe (stderr to a file).
struct Child {
  pid_t pid = -1;
  int out_fd = -1;

  explicit Child(std::vector<std::string> args) {
    int fds[2];
    if (pipe(fds) != 0) return;
    pid = fork();
    if (pid == 0) {
      dup2(fds[1], 1);
      int err = open("/dev/null", O_WRONLY);
      dup2(err, 2);
      close(fds[0]);
      std::vector<char*> argv{const_cast<char*>(kBinary.c_str())};
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(kBinary.c_str(), argv.data());
      _exit(127);
    }
    close(fds[1]);
    out_fd = fds[0];
  }
  ~Child() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
    if (out_fd >= 0) close(out_fd);
  }
  /// Reads stdout until `needle` appears or EOF/deadline. Returns what was read.
  std::string ReadUntil(const std::string& needle, int timeout_ms) {
    std::string s;
    fcntl(out_fd, F_SETFL, O_NONBLOCK);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    char buf[4096];
    while (std::chrono::steady_clock::now() < deadline) {
      ssize_t n = read(out_fd, buf, sizeof buf);
      if (n > 0) {
        s.append(buf, static_cast<size_t>(n));
        if (!needle.empty() && s.find(needle) != std::string::npos) break;
      } else if (n == 0) {
        break;
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
    return s;
  }
  /// Waits for exit (deadline); returns the exit status or -1.
  int Wait(int timeout_ms) {
    int st = 0;
    const bool exited = kvpush::testing::WaitUntil(
        [&] { return waitpid(pid, &st, WNOHANG) == pid; }, std::chrono::milliseconds(timeout_ms),
        std::chrono::milliseconds(10));
    if (!exited) return -1;
    pid = -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  }
};

#define REQUIRE_BINARY()                                              \
  if (!std::filesystem::exists(kBinary)) {                            \
    GTEST_SKIP() << kBinary << " not built (ninja kvpush); skipping"; \
  }

TEST(ServeCommandTest, RefusesBadConfig) {
  REQUIRE_BINARY();
  KVP_REQUIRE_SHARED_MODEL(gguf, "stories260K.gguf");
  Child bad_backend({"serve", "--model", gguf, "--role", "prefill", "--port", "0",
                     "--kv-transfer-config", R"({"kv_connector_extra_config":{"backend":"nope"}})"});
  EXPECT_EQ(bad_backend.Wait(30000), 2);
  Child not_json({"serve", "--model", gguf, "--role", "decode", "--port", "0",
                  "--kv-transfer-config", "not json"});
  EXPECT_EQ(not_json.Wait(30000), 2);
  Child contradiction({"serve", "--model", gguf, "--role", "decode", "--port", "0",
                       "--kv-transfer-config", R"({"kv_role":"kv_producer"})"});
  EXPECT_EQ(contradiction.Wait(30000), 2);
  Child bad({"serve", "--model", gguf, "--block-size", "0", "--port", "0"});
  EXPECT_EQ(bad.Wait(30000), 2);
  Child too_long({"serve", "--model", gguf, "--max-model-len", "100000", "--port", "0"});
  EXPECT_EQ(too_long.Wait(30000), 2);
}

TEST(ServeCommandTest, GenerateReproducesTheReference) {
  REQUIRE_BINARY();
  KVP_REQUIRE_SHARED_MODEL(gguf, "stories260K.gguf");
  KVP_REQUIRE_SHARED_MODEL(refp, "stories260K.reference.json");
  std::ifstream f(refp);
  json ref = json::parse(f)["generation"][0];
  Child gen({"generate", "--model", gguf, "--temperature", "0", "--max-tokens",
             std::to_string(ref["output_tokens"].size())});
  std::string out = gen.ReadUntil("", 60000);
  EXPECT_EQ(gen.Wait(60000), 0);
  EXPECT_EQ(out, ref["output_text"].get<std::string>() + "\n");
}

TEST(ServeCommandTest, ServesAndStopsCleanlyOnSigterm) {
  REQUIRE_BINARY();
  KVP_REQUIRE_SHARED_MODEL(gguf, "stories260K.gguf");
  Child serve({"serve", "--model", gguf, "--port", "0", "--served-model-name", "s260k",
               "--log-level", "warn"});
  std::string out = serve.ReadUntil("\n", 60000);
  auto pos = out.find("listening on http://127.0.0.1:");
  ASSERT_NE(pos, std::string::npos) << out;
  const int port = std::stoi(out.substr(pos + 30));
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(30, 0);
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  auto r = c.Post("/v1/completions",
                  R"({"model":"s260k","prompt":[1],"max_tokens":12,"temperature":0,
                      "return_token_ids":true})",
                  "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(ParseJson(r->body)["choices"][0]["token_ids"],
            json({403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421}));
  kill(serve.pid, SIGTERM);
  EXPECT_EQ(serve.Wait(30000), 0);
}

}  // namespace
}  // namespace kvpush::testing
