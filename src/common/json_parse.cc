#include "common/json_parse.h"

#include <simdjson.h>

#include <string>

namespace kvpush {

using nlohmann::json;

namespace {

/// simdjson's DOM element as the nlohmann value nlohmann's own parser makes of the same text.
json ToJson(simdjson::dom::element e) {
  using simdjson::dom::element_type;
  switch (e.type()) {
    case element_type::ARRAY: {
      json a = json::array();
      simdjson::dom::array arr;
      if (e.get_array().get(arr) != simdjson::SUCCESS) return a;
      auto& v = a.get_ref<json::array_t&>();
      v.reserve(arr.size());
      for (simdjson::dom::element x : arr) v.push_back(ToJson(x));
      return a;
    }
    case element_type::OBJECT: {
      json o = json::object();
      simdjson::dom::object obj;
      if (e.get_object().get(obj) != simdjson::SUCCESS) return o;
      for (simdjson::dom::key_value_pair kv : obj) {
        o[std::string(kv.key)] = ToJson(kv.value);  // a duplicated key: the last value, as nlohmann
      }
      return o;
    }
    case element_type::INT64: {
      const int64_t i = e.get_int64().value_unsafe();
      return i >= 0 ? json(static_cast<uint64_t>(i)) : json(i);  // nlohmann: unsigned if >= 0
    }
    case element_type::UINT64:
      return json(e.get_uint64().value_unsafe());
    case element_type::DOUBLE:
      return json(e.get_double().value_unsafe());
    case element_type::STRING:
      return json(std::string(e.get_string().value_unsafe()));
    case element_type::BOOL:
      return json(e.get_bool().value_unsafe());
    case element_type::NULL_VALUE:
      return json(nullptr);
  }
  return json(nullptr);
}

}  // namespace

json ParseJson(std::string_view text) {
  simdjson::dom::parser parser;
  simdjson::dom::element root;
  if (parser.parse(simdjson::padded_string(text)).get(root) == simdjson::SUCCESS) {
    return ToJson(root);
  }
  return json::parse(text, nullptr, /*allow_exceptions=*/false);
}

}  // namespace kvpush
