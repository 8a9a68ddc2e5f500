// vLLM's `serve --config FILE.yaml` (a YAML mapping of flag names, with dashes or underscores and
// without the leading "--", to values), read with yaml-cpp (Debian's libyaml-cpp-dev) and turned
// into command-line flags before CLI11 parses them: CLI11 2.1 reads config files for the top
// command only, and vLLM's form puts --config after the subcommand.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace kvpush::apps {

/// The flags of a YAML config file's text, each as one "--name=value" argument: a scalar is one
/// value ("true"/"false" for a flag), a sequence of scalars one argument per element (a
/// repeated flag, e.g. served-model-name: [a, b]), a mapping the JSON text of a JSON flag (e.g.
/// kv-transfer-config: {kv_connector: NixlConnector}); null values are skipped, '_' in a key
/// reads as '-'. Errors: kInvalidArgument (not YAML, not a mapping, a nested sequence) with
/// yaml-cpp's line and column. Pure.
Result<std::vector<std::string>> YamlConfigFlags(const std::string& text);

/// `args` (argv without the program name) with `SUBCOMMAND ... --config FILE` (or --config=FILE)
/// replaced by the file's flags, put right after the subcommand so that the other arguments
/// follow them; a flag also given on the command line is dropped from the file's (the command
/// line wins, as in vLLM). Only `subcommand`'s --config is read. Errors: kNotFound (unreadable
/// file), kInvalidArgument (YamlConfigFlags, or --config without a file).
Result<std::vector<std::string>> ExpandConfigFile(std::vector<std::string> args,
                                                  const std::string& subcommand);

}  // namespace kvpush::apps
