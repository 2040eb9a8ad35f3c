// safetensors header: dtypes, parse and validate, format, layout order
// (strata/store/safetensors.hpp; the spec is quoted there).
#include "strata/store/safetensors.hpp"

#include <algorithm>
#include <array>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

namespace strata::safetensors {
namespace {

using json = nlohmann::json;

struct DTypeRow {
  StDType t;
  std::string_view name;
  size_t size;
};
constexpr std::array<DTypeRow, 15> kDTypes{{
    {StDType::kBool, "BOOL", 1}, {StDType::kU8, "U8", 1},
    {StDType::kI8, "I8", 1},     {StDType::kF8_E5M2, "F8_E5M2", 1},
    {StDType::kF8_E4M3, "F8_E4M3", 1}, {StDType::kI16, "I16", 2},
    {StDType::kU16, "U16", 2},   {StDType::kF16, "F16", 2},
    {StDType::kBF16, "BF16", 2}, {StDType::kI32, "I32", 4},
    {StDType::kU32, "U32", 4},   {StDType::kF32, "F32", 4},
    {StDType::kF64, "F64", 8},   {StDType::kI64, "I64", 8},
    {StDType::kU64, "U64", 8},
}};

std::string q(std::string_view s) { return "'" + std::string(s) + "'"; }

/// "[a, b)" of file offsets.
std::string range(uint64_t a, uint64_t b) {
  return "[" + std::to_string(a) + ", " + std::to_string(b) + ")";
}

Status bad(std::string_view path, const std::string& what) {
  return data_loss("safetensors file " + q(path) + ": " + what);
}

bool mul_overflows(uint64_t a, uint64_t b, uint64_t* out) { return __builtin_mul_overflow(a, b, out); }

/// A non-negative integer of the JSON (unsigned, or a signed one >= 0).
std::optional<uint64_t> as_uint(const json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer() && v.get<int64_t>() >= 0) return static_cast<uint64_t>(v.get<int64_t>());
  return std::nullopt;
}

}  // namespace

std::string_view dtype_name(StDType t) noexcept { return kDTypes[static_cast<size_t>(t)].name; }
size_t dtype_size(StDType t) noexcept { return kDTypes[static_cast<size_t>(t)].size; }

std::optional<StDType> parse_dtype(std::string_view name) noexcept {
  for (const auto& r : kDTypes)
    if (r.name == name) return r.t;
  return std::nullopt;
}

std::optional<DType> to_strata(StDType t) noexcept {
  switch (t) {
    case StDType::kBool: return DType::kBool;
    case StDType::kU8: return DType::kUInt8;
    case StDType::kI8: return DType::kInt8;
    case StDType::kI16: return DType::kInt16;
    case StDType::kF16: return DType::kFloat16;
    case StDType::kBF16: return DType::kBFloat16;
    case StDType::kI32: return DType::kInt32;
    case StDType::kF32: return DType::kFloat32;
    case StDType::kF64: return DType::kFloat64;
    case StDType::kI64: return DType::kInt64;
    default: return std::nullopt;
  }
}

StDType from_strata(DType t) noexcept {
  switch (t) {
    case DType::kFloat32: return StDType::kF32;
    case DType::kFloat16: return StDType::kF16;
    case DType::kBFloat16: return StDType::kBF16;
    case DType::kFloat64: return StDType::kF64;
    case DType::kInt8: return StDType::kI8;
    case DType::kInt16: return StDType::kI16;
    case DType::kInt32: return StDType::kI32;
    case DType::kInt64: return StDType::kI64;
    case DType::kUInt8: return StDType::kU8;
    case DType::kBool: return StDType::kBool;
  }
  return StDType::kU8;
}

uint64_t TensorEntry::numel() const {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;  // (parse_header checked the product fits)
  return n;
}

const TensorEntry* Header::find(std::string_view name) const {
  auto it = std::lower_bound(by_name.begin(), by_name.end(), name,
                             [&](size_t i, std::string_view n) { return tensors[i].name < n; });
  if (it == by_name.end() || tensors[*it].name != name) return nullptr;
  return &tensors[*it];
}

Result<uint64_t> parse_header_length(std::string_view prefix, uint64_t file_nbytes,
                                     std::string_view path) {
  if (file_nbytes < 8 || prefix.size() < 8) {
    return bad(path, "the file ends at byte " + std::to_string(std::min<uint64_t>(file_nbytes, prefix.size())) +
                         ", inside the 8-byte header length (bytes [0, 8)): truncated or not a "
                         "safetensors file");
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(prefix[static_cast<size_t>(i)]);
  if (n > kMaxHeaderBytes) {
    return bad(path, "header length " + std::to_string(n) + " (bytes [0, 8)) exceeds the format's " +
                         std::to_string(kMaxHeaderBytes) + "-byte limit: not a safetensors file");
  }
  if (n > file_nbytes - 8) {
    return bad(path, "header bytes " + range(8, 8 + n) + " run past the end of the file at byte " +
                         std::to_string(file_nbytes) + " (header length " + std::to_string(n) +
                         " at bytes [0, 8)): truncated");
  }
  return n;
}

Result<Header> parse_header(std::string_view text, uint64_t file_nbytes, std::string_view path) {
  Header h;
  h.header_nbytes = text.size();
  h.file_nbytes = file_nbytes;
  if (text.empty() || text[0] != '{') {
    return bad(path, "the header at byte 8 does not start with '{': not a JSON object");
  }
  // Duplicate top-level keys: nlohmann keeps the last silently; the format has one entry
  // per name.
  std::set<std::string> seen;
  std::string dup;
  json::parser_callback_t cb = [&](int depth, json::parse_event_t ev, json& parsed) {
    if (ev == json::parse_event_t::key && depth == 1 && dup.empty()) {
      std::string k = parsed.get<std::string>();
      if (!seen.insert(k).second) dup = k;
    }
    return true;
  };
  json root;
  try {
    root = json::parse(text.begin(), text.end(), cb, /*allow_exceptions=*/true);
  } catch (const json::parse_error& e) {
    const uint64_t at = 8 + (e.byte > 0 ? e.byte - 1 : 0);
    std::string what = e.what();
    if (auto p = what.find("; last read"); p != std::string::npos) what = what.substr(p + 2);
    return bad(path, "the header's JSON is invalid at byte " + std::to_string(at) + " (" + what + ")");
  } catch (const json::exception& e) {
    return bad(path, std::string("the header's JSON is invalid: ") + e.what());
  }
  if (!root.is_object()) return bad(path, "the header at byte 8 is not a JSON object");
  if (!dup.empty()) return bad(path, "the header names tensor " + q(dup) + " twice");
  const uint64_t data_start = 8 + h.header_nbytes;
  const uint64_t data_nbytes = file_nbytes - std::min(file_nbytes, data_start);
  for (auto it = root.begin(); it != root.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) return bad(path, "\"__metadata__\" is not a JSON object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) {
          return bad(path, "\"__metadata__\" value of " + q(m.key()) + " is not a string");
        }
        h.metadata.emplace_back(m.key(), m.value().get<std::string>());
      }
      continue;
    }
    const std::string t = "tensor " + q(name);
    if (!v.is_object()) return bad(path, t + ": its entry is not a JSON object");
    auto dt = v.find("dtype"), sh = v.find("shape"), off = v.find("data_offsets");
    if (dt == v.end() || sh == v.end() || off == v.end()) {
      return bad(path, t + ": its entry lacks \"" +
                           std::string(dt == v.end() ? "dtype" : sh == v.end() ? "shape" : "data_offsets") +
                           "\"");
    }
    TensorEntry e;
    e.name = name;
    if (!dt->is_string()) return bad(path, t + ": \"dtype\" is not a string");
    auto parsed = parse_dtype(dt->get<std::string>());
    if (!parsed) return bad(path, t + ": unknown dtype " + q(dt->get<std::string>()));
    e.dtype = *parsed;
    if (!sh->is_array()) return bad(path, t + ": \"shape\" is not an array");
    uint64_t numel = 1;
    for (const auto& d : *sh) {
      auto u = as_uint(d);
      if (!u) return bad(path, t + ": \"shape\" holds " + d.dump() + ", not an integer >= 0");
      e.shape.push_back(*u);
      if (mul_overflows(numel, *u, &numel)) return bad(path, t + ": shape " + sh->dump() + " overflows 64 bits");
    }
    if (!off->is_array() || off->size() != 2) {
      return bad(path, t + ": \"data_offsets\" is not an array of two integers");
    }
    auto b = as_uint((*off)[0]), en = as_uint((*off)[1]);
    if (!b || !en) return bad(path, t + ": \"data_offsets\" " + off->dump() + " are not integers >= 0");
    e.begin = *b;
    e.end = *en;
    if (e.begin > e.end) {
      return bad(path, t + ": data_offsets " + off->dump() + " end before they begin");
    }
    if (e.end > data_nbytes) {
      return bad(path, t + ": data_offsets " + off->dump() + " (file bytes " +
                           range(data_start + e.begin, data_start + e.end) +
                           ") run past the end of the file at byte " + std::to_string(file_nbytes));
    }
    uint64_t want = 0;
    if (mul_overflows(numel, dtype_size(e.dtype), &want) || want != e.end - e.begin) {
      return bad(path, t + ": shape " + sh->dump() + " of " + std::string(dtype_name(e.dtype)) + " is " +
                           (want == 0 && numel != 0 ? std::string("more than 2^64") : std::to_string(want)) +
                           " bytes, but data_offsets " + off->dump() + " (file bytes " +
                           range(data_start + e.begin, data_start + e.end) + ") hold " +
                           std::to_string(e.end - e.begin));
    }
    h.tensors.push_back(std::move(e));
  }
  std::sort(h.tensors.begin(), h.tensors.end(), [](const TensorEntry& a, const TensorEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t pos = 0;
  const TensorEntry* prev = nullptr;
  for (const auto& e : h.tensors) {
    if (e.begin < pos) {
      return bad(path, "tensor " + q(e.name) + " (file bytes " +
                           range(data_start + e.begin, data_start + e.end) + ") overlaps tensor " +
                           q(prev->name) + " (file bytes " +
                           range(data_start + prev->begin, data_start + prev->end) + ")");
    }
    if (e.begin > pos) {
      return bad(path, "file bytes " + range(data_start + pos, data_start + e.begin) +
                           " belong to no tensor (a hole before tensor " + q(e.name) + ")");
    }
    pos = e.end;
    prev = &e;
  }
  if (pos != data_nbytes) {
    return bad(path, "file bytes " + range(data_start + pos, file_nbytes) +
                         " after the last tensor belong to no tensor");
  }
  h.by_name.resize(h.tensors.size());
  for (size_t i = 0; i < h.by_name.size(); ++i) h.by_name[i] = i;
  std::sort(h.by_name.begin(), h.by_name.end(),
            [&](size_t a, size_t b) { return h.tensors[a].name < h.tensors[b].name; });
  return h;
}

Result<Header> parse(std::string_view bytes, uint64_t file_nbytes, std::string_view path) {
  STRATA_ASSIGN_OR_RETURN(uint64_t n, parse_header_length(bytes.substr(0, 8), file_nbytes, path));
  if (bytes.size() < 8 + n) {
    return bad(path, "only " + std::to_string(bytes.size()) + " of the header's bytes " +
                         range(8, 8 + n) + " could be read");
  }
  return parse_header(bytes.substr(8, n), file_nbytes, path);
}

std::string format_header(const std::vector<TensorEntry>& tensors,
                          const std::vector<std::pair<std::string, std::string>>& metadata,
                          uint64_t data_alignment) {
  json root = json::object();
  if (!metadata.empty()) {
    json m = json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    root["__metadata__"] = std::move(m);
  }
  for (const auto& e : tensors) {
    root[e.name] = {{"dtype", std::string(dtype_name(e.dtype))},
                    {"shape", e.shape},
                    {"data_offsets", {e.begin, e.end}}};
  }
  std::string text = root.dump();
  const uint64_t align = std::max<uint64_t>(8, data_alignment);
  const uint64_t total = (8 + text.size() + align - 1) / align * align;
  text.append(total - 8 - text.size(), ' ');
  std::string out(8, '\0');
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + text;
}

std::vector<size_t> layout_order(const std::vector<TensorEntry>& entries) {
  std::vector<size_t> order(entries.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (entries[a].dtype != entries[b].dtype) return entries[a].dtype > entries[b].dtype;
    return entries[a].name < entries[b].name;
  });
  return order;
}

}  // namespace strata::safetensors
