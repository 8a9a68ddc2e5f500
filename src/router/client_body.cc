#include "router/client_body.h"

#include <simdjson.h>

#include <algorithm>

#include "common/json_parse.h"

namespace kvpush::router {

using nlohmann::json;

namespace {

/// The value's bytes as written: an array or object whole, a scalar's token.
simdjson::error_code RawJson(simdjson::ondemand::value& v, std::string_view* raw) {
  simdjson::ondemand::json_type type;
  if (auto e = v.type().get(type); e != simdjson::SUCCESS) return e;
  if (type == simdjson::ondemand::json_type::array) {
    simdjson::ondemand::array a;
    if (auto e = v.get_array().get(a); e != simdjson::SUCCESS) return e;
    return a.raw_json().get(*raw);
  }
  if (type == simdjson::ondemand::json_type::object) {
    simdjson::ondemand::object o;
    if (auto e = v.get_object().get(o); e != simdjson::SUCCESS) return e;
    return o.raw_json().get(*raw);
  }
  *raw = v.raw_json_token();
  return simdjson::SUCCESS;
}

bool IsJsonSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/// The top-level members' value spans of an object text simdjson's DOM parser accepted. False if
/// the on-demand pass disagrees (then the body is used without client bytes).
bool FindMembers(const simdjson::padded_string& padded, std::vector<ClientBody::Member>* out) {
  simdjson::ondemand::parser parser;
  simdjson::ondemand::document doc;
  simdjson::ondemand::object obj;
  if (parser.iterate(padded).get(doc) != simdjson::SUCCESS) return false;
  if (doc.get_object().get(obj) != simdjson::SUCCESS) return false;
  const char* base = padded.data();
  for (auto field : obj) {
    std::string_view key, raw;
    if (field.unescaped_key().get(key) != simdjson::SUCCESS) return false;
    std::string k(key);
    simdjson::ondemand::value value;
    if (field.value().get(value) != simdjson::SUCCESS) return false;
    if (RawJson(value, &raw) != simdjson::SUCCESS) return false;
    while (!raw.empty() && IsJsonSpace(raw.back())) raw.remove_suffix(1);
    const ClientBody::Member m{std::move(k), static_cast<size_t>(raw.data() - base), raw.size()};
    auto same = std::find_if(out->begin(), out->end(),
                             [&](const ClientBody::Member& x) { return x.key == m.key; });
    if (same != out->end()) out->erase(same);  // the last value counts, as in doc
    out->push_back(m);
  }
  return true;
}

}  // namespace

const ClientBody::Member* ClientBody::Find(std::string_view key) const {
  for (const Member& m : members) {
    if (m.key == key) return &m;
  }
  return nullptr;
}

bool ClientBody::Verbatim(std::string_view key) const {
  return (key == "prompt" || key == "messages") && Find(key) != nullptr;
}

json ClientBody::Shell() const {
  if (members.empty() || !doc.is_object()) return doc;
  json shell = json::object();
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    if (!Verbatim(it.key())) shell[it.key()] = *it;
  }
  return shell;
}

Result<ClientBody> ParseClientBody(std::string_view text) {
  ClientBody body;
  body.doc = ParseJson(text);
  if (body.doc.is_discarded()) return InvalidArgument("request body is not valid JSON");
  if (body.doc.is_object() && FindMembers(simdjson::padded_string(text), &body.members)) {
    body.text.assign(text);
  } else {
    body.members.clear();
  }
  return body;
}

std::string ComposeLegBody(const json& leg, const ClientBody& client) {
  if (!leg.is_object() || client.members.empty() || !client.doc.is_object()) return leg.dump();
  std::string out = "{";
  for (auto it = leg.begin(); it != leg.end(); ++it) {
    if (out.size() > 1) out += ',';
    out += json(it.key()).dump();
    out += ':';
    const ClientBody::Member* m = client.Find(it.key());
    const auto c = client.doc.find(it.key());
    if (m != nullptr && c != client.doc.end() && c->type() == it->type() && *c == *it) {
      out.append(client.text, m->offset, m->length);
    } else {
      out += it->dump();
    }
  }
  for (const ClientBody::Member& m : client.members) {
    if (!client.Verbatim(m.key) || leg.contains(m.key)) continue;
    if (out.size() > 1) out += ',';
    out += json(m.key).dump();
    out += ':';
    out.append(client.text, m.offset, m.length);
  }
  out += '}';
  return out;
}

}  // namespace kvpush::router
