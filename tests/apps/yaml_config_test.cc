// apps/yaml_config.h: vLLM's `serve --config FILE.yaml` as command-line flags.
#include "apps/yaml_config.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

namespace kvpush::apps {
namespace {

using Args = std::vector<std::string>;

TEST(YamlConfig, ScalarsListsAndMappingsBecomeFlags) {
  auto f = YamlConfigFlags(
      "model: /m.gguf\n"
      "max_num_seqs: 8\n"
      "enforce-eager: true\n"
      "served-model-name: [a, b]\n"
      "seed: ~\n"
      "kv-transfer-config:\n"
      "  kv_connector: NixlConnector\n"
      "  kv_connector_extra_config: {backends: [UCX], kv_lease_duration: 7.5, id: '01'}\n");
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  const std::string kv_json =
      R"({"kv_connector":"NixlConnector","kv_connector_extra_config":)"
      R"({"backends":["UCX"],"id":"01","kv_lease_duration":7.5}})";
  EXPECT_EQ(*f, (Args{"--model=/m.gguf", "--max-num-seqs=8", "--enforce-eager=true",
                      "--served-model-name=a", "--served-model-name=b",
                      "--kv-transfer-config=" + kv_json}));
  EXPECT_TRUE(YamlConfigFlags("").ok());
}

TEST(YamlConfig, RefusesWhatIsNotAMappingOfFlags) {
  for (const char* bad : {"- a\n- b\n", "just a string", "a: [[1, 2]]\n", "a: {b: [}\n"}) {
    auto f = YamlConfigFlags(bad);
    EXPECT_FALSE(f.ok()) << bad;
    EXPECT_EQ(f.status().code(), StatusCode::kInvalidArgument) << bad;
  }
}

TEST(YamlConfig, TheFilesFlagsGoAfterTheSubcommandAndTheCommandLineWins) {
  const std::string path = ::testing::TempDir() + "/kvpush-serve.yaml";
  {
    std::ofstream(path) << "port: 8100\nmax-num-seqs: 8\n";
  }
  auto a = ExpandConfigFile({"serve", "m.gguf", "--config", path, "--port", "9000"}, "serve");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(*a, (Args{"serve", "--max-num-seqs=8", "m.gguf", "--port", "9000"}));
  auto b = ExpandConfigFile({"serve", "--config=" + path}, "serve");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*b, (Args{"serve", "--port=8100", "--max-num-seqs=8"}));
  // Another subcommand's arguments are left alone; so is a command line without --config.
  EXPECT_EQ(*ExpandConfigFile({"router", "--config", path}, "serve"),
            (Args{"router", "--config", path}));
  EXPECT_EQ(*ExpandConfigFile({"serve", "m.gguf"}, "serve"), (Args{"serve", "m.gguf"}));
  EXPECT_EQ(ExpandConfigFile({"serve", "--config", "/nonexistent.yaml"}, "serve").status().code(),
            StatusCode::kNotFound);
  EXPECT_EQ(ExpandConfigFile({"serve", "--config"}, "serve").status().code(),
            StatusCode::kInvalidArgument);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace kvpush::apps
