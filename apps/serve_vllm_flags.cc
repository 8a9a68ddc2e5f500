#include "apps/serve_vllm_flags.h"

#include <fstream>
#include <memory>
#include <sstream>


namespace kvpush::apps {
namespace {

/// A CLI11 check that always fails with `message` (a vLLM flag with no meaning here).
CLI::Validator Refuse(const std::string& message) {
  return CLI::Validator([message](const std::string&) { return message; }, "", "refused");
}

/// A CLI11 check accepting only `allowed` values; anything else gets `why`.
CLI::Validator OnlyValues(std::vector<std::string> allowed, std::string why) {
  return CLI::Validator(
      [allowed = std::move(allowed), why = std::move(why)](const std::string& v) {
        for (const std::string& a : allowed) {
          if (v == a) return std::string();
        }
        return "'" + v + "': " + why;
      },
      "", "value");
}

}  // namespace

void AddVllmServeFlags(CLI::App* cmd, ServeOptions* o) {
  cmd->add_option("model", o->model_positional,
                  "Model file, as vLLM's positional MODEL (same as --model)");
  // Read before CLI11 parses (apps/yaml_config.h, main.cc); listed here for --help.
  cmd->add_option("--config", "YAML file of flags, as vLLM reads it: one `flag-name: value` per "
                              "line (a list for a repeated flag, a mapping for a JSON flag); "
                              "command-line flags win");
  cmd->add_option_function<uint64_t>("--seed", [o](uint64_t v) { o->seed = v; },
                  "Seed of the generator that unseeded requests draw their sampling seeds from "
                  "(vLLM's --seed): the same requests in the same order sample the same tokens "
                  "(default: a random seed per server start)");
  cmd->add_option_function<std::string>(
         "--dtype", [](const std::string&) {},
         "Compute type, vLLM's --dtype: auto or float32 only (kvpush's CPU executor computes in "
         "float32; weights keep the types the GGUF file stores)")
      ->check(OnlyValues({"auto", "float32", "float"},
                         "kvpush computes in float32 on CPUs (auto, float32); to serve "
                         "smaller weights, serve a GGUF file that stores them (f16, bf16, q8_0, q4_k, q6_k; kvpush gen-model --dtype writes one)"));
  cmd->add_option_function<std::string>(
         "--kv-cache-dtype", [](const std::string&) {},
         "KV cache type, vLLM's --kv-cache-dtype: auto only (the KV cache is float32, the "
         "compute type)")
      ->check(OnlyValues({"auto"}, "kvpush's KV cache is float32 (the executor's compute type); "
                                   "only auto is accepted"));
  cmd->add_option_function<double>(
         "--gpu-memory-utilization", [](double) {},
         "vLLM's GPU memory fraction: refused (use --kv-cache-memory-bytes)")
      ->check(Refuse("kvpush runs on CPUs and has no GPU memory to share out: size the KV cache "
                     "with --kv-cache-memory-bytes BYTES or --num-gpu-blocks-override BLOCKS"));
  cmd->add_flag("--enforce-eager")->description("Accepted for vLLM's launch lines: kvpush never captures CUDA "
                                   "graphs, it always runs eagerly");
  cmd->add_option("--api-key", o->api_key,
                  "Require `Authorization: Bearer KEY` on every path but /health, /version and "
                  "/metrics, the P/D endpoints /kv/* included; the instance's own calls to its "
                  "peers carry it (default: $VLLM_API_KEY)")
      ->envname("VLLM_API_KEY");
  cmd->add_option("--chat-template", o->chat_template,
                  "A Jinja chat template (a file, or the template's text) replacing the model's: "
                  "its family is detected (chatml, qwen3, llama3, llama2, mistral); another is "
                  "refused");
  cmd->add_option("--ssl-certfile", o->ssl_certfile,
                  "Serve HTTPS only with this PEM certificate (with --ssl-keyfile); a P/D "
                  "instance's peers and the router then reach it over TLS")
      ->check(CLI::ExistingFile);
  cmd->add_option("--otlp-traces-endpoint", o->otlp_traces_endpoint,
                  "Export a span per request (engine phases and, on P/D, the handoff phases as "
                  "children; the parent from the request's W3C traceparent) over OTLP/HTTP "
                  "(protobuf) to this URL, e.g. http://127.0.0.1:4318/v1/traces");
  cmd->add_option("--ssl-keyfile", o->ssl_keyfile, "The PEM private key of --ssl-certfile")
      ->check(CLI::ExistingFile);
  cmd->add_option("--ssl-ca-certs", o->ssl_ca_certs,
                  "P/D: the PEM CA certificates that https peers' certificates must chain to (a "
                  "decode instance's handshake with an https prefill instance; default: the "
                  "system's CAs)")
      ->check(CLI::ExistingFile);
  cmd->add_flag("--disable-log-requests{false},--enable-log-requests{true}", o->log_requests,
                "Turn the access log (one line per request at info) off or on (default: on)");
}

Status ResolveServeModelPath(ServeOptions& o) {
  if (o.model_positional.empty()) return Status::Ok();
  if (!o.model.empty() && o.model != o.model_positional) {
    return InvalidArgument("the positional MODEL '" + o.model_positional + "' and --model '" +
                           o.model + "' differ: give one");
  }
  o.model = o.model_positional;
  return Status::Ok();
}

Result<ChatTemplate> LoadChatTemplateFlag(const std::string& flag) {
  std::string text = flag;
  const bool inline_text =
      flag.find("{{") != std::string::npos || flag.find("{%") != std::string::npos;
  if (!inline_text) {
    std::ifstream in(flag);
    if (!in) return NotFound("--chat-template: cannot read '" + flag + "'");
    std::ostringstream ss;
    ss << in.rdbuf();
    text = ss.str();
  }
  const DetectedChatTemplate d = DetectChatTemplate(text);
  if (!d.recognised) {
    return InvalidArgument("--chat-template " + (inline_text ? std::string("(text)") : flag) +
                           ": a template of no family kvpush renders (chatml, qwen3, llama3, "
                           "llama2, mistral); --chat-template-format plain serves kvpush's plain "
                           "template instead");
  }
  return d.chat_template;
}

}  // namespace kvpush::apps
