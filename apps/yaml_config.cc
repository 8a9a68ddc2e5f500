#include "apps/yaml_config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

namespace kvpush::apps {
namespace {

/// A YAML node as JSON: unquoted scalars that read as integers, floats or booleans become
/// numbers and booleans (YAML's core schema), the rest strings.
nlohmann::json ToJson(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Map: {
      nlohmann::json j = nlohmann::json::object();
      for (const auto& kv : n) j[kv.first.as<std::string>()] = ToJson(kv.second);
      return j;
    }
    case YAML::NodeType::Sequence: {
      nlohmann::json j = nlohmann::json::array();
      for (const auto& e : n) j.push_back(ToJson(e));
      return j;
    }
    case YAML::NodeType::Scalar: {
      if (n.Tag() == "!") return n.as<std::string>();  // quoted: a string whatever it reads as
      int64_t i = 0;
      double d = 0;
      bool b = false;
      if (YAML::convert<int64_t>::decode(n, i)) return i;
      if (YAML::convert<double>::decode(n, d)) return d;
      if (YAML::convert<bool>::decode(n, b)) return b;
      return n.as<std::string>();
    }
    default:
      return nullptr;
  }
}

/// "--name" of an argument ("--name=value" or "--name"); "" for anything else.
std::string FlagOf(const std::string& arg) {
  if (arg.size() < 3 || arg.rfind("--", 0) != 0) return "";
  return arg.substr(0, arg.find('='));
}

Result<std::vector<std::string>> Flags(const YAML::Node& root) {
  if (root.IsNull()) return std::vector<std::string>{};
  if (!root.IsMap()) return InvalidArgument("--config: the YAML file must be a mapping of flags");
  std::vector<std::string> out;
  for (const auto& kv : root) {
    std::string name = kv.first.as<std::string>();
    std::replace(name.begin(), name.end(), '_', '-');
    const std::string flag = "--" + name + "=";
    const YAML::Node& v = kv.second;
    if (v.IsNull()) continue;
    if (v.IsScalar()) {
      out.push_back(flag + v.as<std::string>());
    } else if (v.IsSequence()) {
      for (const auto& e : v) {
        if (!e.IsScalar()) return InvalidArgument("--config: '" + name + "' holds a nested list");
        out.push_back(flag + e.as<std::string>());
      }
    } else {
      out.push_back(flag + ToJson(v).dump());
    }
  }
  return out;
}

}  // namespace

Result<std::vector<std::string>> YamlConfigFlags(const std::string& text) {
  try {
    return Flags(YAML::Load(text));
  } catch (const YAML::Exception& e) {
    return InvalidArgument(std::string("--config: ") + e.what());
  }
}

Result<std::vector<std::string>> ExpandConfigFile(std::vector<std::string> args,
                                                  const std::string& subcommand) {
  const auto sub = std::find(args.begin(), args.end(), subcommand);
  if (sub == args.end()) return args;
  const auto at = static_cast<size_t>(sub - args.begin()) + 1;
  std::string path;
  size_t i = at;
  for (; i < args.size(); ++i) {
    if (args[i] == "--config" || args[i].rfind("--config=", 0) == 0) break;
  }
  if (i == args.size()) return args;
  if (args[i] == "--config") {
    if (i + 1 == args.size()) return InvalidArgument("--config needs a YAML file");
    path = args[i + 1];
    args.erase(args.begin() + static_cast<std::ptrdiff_t>(i),
               args.begin() + static_cast<std::ptrdiff_t>(i) + 2);
  } else {
    path = args[i].substr(9);
    args.erase(args.begin() + static_cast<std::ptrdiff_t>(i));
  }
  std::ifstream in(path);
  if (!in) return NotFound("--config: cannot read '" + path + "'");
  std::ostringstream text;
  text << in.rdbuf();
  KVP_ASSIGN_OR_RETURN(std::vector<std::string> from_file, YamlConfigFlags(text.str()));
  std::set<std::string> given;
  for (size_t k = at; k < args.size(); ++k) given.insert(FlagOf(args[k]));
  std::vector<std::string> kept;
  for (std::string& f : from_file) {
    if (given.count(FlagOf(f)) == 0) kept.push_back(std::move(f));
  }
  args.insert(args.begin() + static_cast<std::ptrdiff_t>(at), kept.begin(), kept.end());
  return args;
}

}  // namespace kvpush::apps
