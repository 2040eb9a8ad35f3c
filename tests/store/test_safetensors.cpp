// safetensors (strata/store/safetensors.hpp): the header parser against files built here by
// hand from the format's specification (8-byte little-endian length, JSON, data), each bad
// input's error naming the file and the byte offsets, format_header round trips, and the
// streaming reader and writer through the IoEngine into / out of memory and store objects.
#include "strata/store/safetensors.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "strata/store/io_engine.hpp"
#include "test_store_util.hpp"

namespace strata {
namespace {

using namespace store_test;
namespace st = safetensors;

/// A file image from the specification: le64(len(json)) + json + data.
std::string image(const std::string& json, const std::string& data) {
  std::string out(8, '\0');
  const uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + json + data;
}

std::string bytes_of(const void* p, size_t n) { return std::string(static_cast<const char*>(p), n); }

Status parse_error(const std::string& img) {
  return st::parse(img, img.size(), "m.safetensors").status();
}

void expect_error(const std::string& img, const std::string& substring) {
  Status s = parse_error(img);
  ASSERT_FALSE(s.ok()) << "parsed: " << substring;
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("safetensors file 'm.safetensors': "), std::string::npos) << s.message();
  EXPECT_NE(s.message().find(substring), std::string::npos) << s.message();
}

void write_file_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string read_file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

TEST(Safetensors, ParsesAFileWrittenFromTheSpecification) {
  const float w[6] = {1.5f, -2.0f, 3.25f, 0.0f, -0.5f, 1e-3f};
  const uint16_t b[3] = {0x3f80, 0xc000, 0x7f80};  // bf16 1, -2, inf
  const int64_t i[1] = {-7};
  const std::string data = bytes_of(w, 24) + bytes_of(b, 6) + bytes_of(i, 8);
  const std::string json =
      R"({"__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
      R"("b":{"dtype":"BF16","shape":[3],"data_offsets":[24,30]},)"
      R"("s":{"dtype":"I64","shape":[],"data_offsets":[30,38]}}   )";
  const std::string img = image(json, data);
  auto h = st::parse(img, img.size(), "m.safetensors");
  ASSERT_OK(h.status());
  EXPECT_EQ(h->header_nbytes, json.size());
  EXPECT_EQ(h->data_start(), 8 + json.size());
  ASSERT_EQ(h->tensors.size(), 3u);
  EXPECT_EQ(h->tensors[0].name, "w");
  EXPECT_EQ(h->tensors[0].dtype, st::StDType::kF32);
  EXPECT_EQ(h->tensors[0].shape, (std::vector<uint64_t>{2, 3}));
  EXPECT_EQ(h->tensors[1].name, "b");
  EXPECT_EQ(h->tensors[1].begin, 24u);
  EXPECT_EQ(h->tensors[1].end, 30u);
  EXPECT_EQ(h->tensors[2].numel(), 1u);
  ASSERT_NE(h->find("s"), nullptr);
  EXPECT_EQ(h->find("s")->dtype, st::StDType::kI64);
  EXPECT_EQ(h->find("x"), nullptr);
  ASSERT_EQ(h->metadata.size(), 1u);
  EXPECT_EQ(h->metadata[0], (std::pair<std::string, std::string>{"format", "pt"}));
  for (const char* name : {"BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "I16", "U16", "F16", "BF16",
                           "I32", "U32", "F32", "F64", "I64", "U64"}) {
    auto t = st::parse_dtype(name);
    ASSERT_TRUE(t) << name;
    EXPECT_EQ(st::dtype_name(*t), name);
  }
  EXPECT_FALSE(st::parse_dtype("F7"));
}

TEST(Safetensors, EachBadInputNamesTheFileAndTheOffset) {
  const std::string ok_entry = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  const std::string data8(8, '\1');
  expect_error(std::string("\x10\0\0\0\0", 5), "the file ends at byte 5, inside the 8-byte header length (bytes [0, 8))");
  {  // header length 100 in a file of 50 bytes
    std::string img = image(std::string(42, ' '), "");
    img[0] = 100;
    expect_error(img, "header bytes [8, 108) run past the end of the file at byte 50");
  }
  {
    std::string img(8, '\0');
    img[7] = 0x7f;  // 2^63-ish
    img += "{}";
    expect_error(img, "exceeds the format's 100000000-byte limit");
  }
  expect_error(image("[1,2]", ""), "the header at byte 8 does not start with '{'");
  expect_error(image(R"({"a":{"dtype":"F32",})", data8), "the header's JSON is invalid at byte 28");
  expect_error(image(R"({"a":{"dtype":"F7","shape":[2],"data_offsets":[0,8]}})", data8),
               "tensor 'a': unknown dtype 'F7'");
  expect_error(image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}})", data8),
               "tensor 'a': data_offsets [0,16] (file bytes [63, 79)) run past the end of the file at byte 71");
  expect_error(image(R"({"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,8]}})", data8),
               "tensor 'a': shape [2,3] of F32 is 24 bytes, but data_offsets [0,8] (file bytes [64, 72)) hold 8");
  expect_error(image("{" + ok_entry + R"(,"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", data8),
               "tensor 'b' (file bytes [119, 123)) overlaps tensor 'a' (file bytes [115, 123))");
  expect_error(image(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", data8),
               "file bytes [62, 66) belong to no tensor (a hole before tensor 'a')");
  expect_error(image("{" + ok_entry + "}", data8 + "xx"),
               "file bytes [70, 72) after the last tensor belong to no tensor");
  expect_error(image("{" + ok_entry + "," + ok_entry + "}", data8), "names tensor 'a' twice");
  expect_error(image(R"({"__metadata__":{"k":1}})", ""), "\"__metadata__\" value of 'k' is not a string");
  expect_error(image(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,8]}})", data8),
               "tensor 'a': \"shape\" holds -1, not an integer >= 0");
  expect_error(image(R"({"a":{"dtype":"F32","data_offsets":[0,8]}})", data8),
               "tensor 'a': its entry lacks \"shape\"");
  expect_error(image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", data8),
               "tensor 'a': data_offsets [8,0] end before they begin");
  expect_error(image(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", data8),
               "overflows 64 bits");
}

TEST(Safetensors, FormatHeaderPadsTheDataToTheAlignmentAndParsesBack) {
  std::vector<st::TensorEntry> es(2);
  es[0] = {"x.weight", st::StDType::kBF16, {3, 5}, 0, 30};
  es[1] = {"x.bias", st::StDType::kF32, {}, 30, 34};
  const std::string hdr = st::format_header(es, {{"format", "pt"}}, 4096);
  EXPECT_EQ(hdr.size(), 4096u);
  EXPECT_EQ(hdr.back(), ' ');
  const std::string img = hdr + std::string(34, '\0');
  auto h = st::parse(img, img.size(), "f");
  ASSERT_OK(h.status());
  EXPECT_EQ(h->data_start(), 4096u);
  ASSERT_EQ(h->tensors.size(), 2u);
  EXPECT_EQ(h->find("x.weight")->shape, (std::vector<uint64_t>{3, 5}));
  EXPECT_EQ(h->find("x.bias")->shape, std::vector<uint64_t>{});
  EXPECT_EQ(h->metadata.size(), 1u);
  // The reference writer's order: 8-byte dtypes first, then by name.
  std::vector<st::TensorEntry> mix(4);
  mix[0] = {"c", st::StDType::kU8, {1}, 0, 0};
  mix[1] = {"b", st::StDType::kF32, {1}, 0, 0};
  mix[2] = {"a", st::StDType::kF32, {1}, 0, 0};
  mix[3] = {"d", st::StDType::kI64, {1}, 0, 0};
  EXPECT_EQ(st::layout_order(mix), (std::vector<size_t>{3, 2, 1, 0}));
}

TEST(Safetensors, ConvertRoundsToNearestEvenAsTorch) {
  // bf16: 1 + 2^-8 is a tie between 1 and 1 + 2^-7: to even (1.0 = 0x3f80);
  // 1 + 3 * 2^-8 -> 1 + 2^-6 (0x3f82); fp16 65520 overflows to inf (0x7c00).
  const float f[3] = {1.00390625f, 1.01171875f, 65520.0f};
  uint16_t bf[3], hf[3];
  ASSERT_OK(st::convert(f, DType::kFloat32, bf, DType::kBFloat16, 3));
  ASSERT_OK(st::convert(f, DType::kFloat32, hf, DType::kFloat16, 3));
  EXPECT_EQ(bf[0], 0x3f80);
  EXPECT_EQ(bf[1], 0x3f82);
  EXPECT_EQ(hf[2], 0x7c00);
  float back[3];
  ASSERT_OK(st::convert(bf, DType::kBFloat16, back, DType::kFloat32, 3));
  EXPECT_EQ(back[0], 1.0f);
  Status s = st::convert(f, DType::kFloat32, bf, DType::kInt16, 1);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("cannot convert fp32 to int16"), std::string::npos) << s.message();
}

/// A file of an odd-length header (data at an unaligned offset) holding a bf16 tensor of
/// `n` elements and an f32 one of `m`, values i * 0.5 (exact in bf16 for small i).
std::string odd_file(uint64_t n, uint64_t m, std::vector<float>* expect_b, std::vector<float>* expect_f) {
  std::vector<uint16_t> b(n);
  std::vector<float> f(m);
  for (uint64_t i = 0; i < n; ++i) {
    float v = static_cast<float>(i % 256) * 0.5f - 17.0f;
    uint32_t u;
    std::memcpy(&u, &v, 4);
    b[i] = static_cast<uint16_t>(u >> 16);
    expect_b->push_back(v);
  }
  for (uint64_t i = 0; i < m; ++i) {
    f[i] = static_cast<float>(i) * 0.25f + 1.0f;
    expect_f->push_back(f[i]);
  }
  const std::string json = R"({"f":{"dtype":"F32","shape":[)" + std::to_string(m) +
                           R"(],"data_offsets":[0,)" + std::to_string(4 * m) +
                           R"(]},"b":{"dtype":"BF16","shape":[)" + std::to_string(n) +
                           R"(],"data_offsets":[)" + std::to_string(4 * m) + "," +
                           std::to_string(4 * m + 2 * n) + "]}}";
  return image(json, bytes_of(f.data(), 4 * m) + bytes_of(b.data(), 2 * n));
}

TEST(Safetensors, ReaderCopiesIntoMemoryAndStoreObjectsConverting) {
  TempDir d;
  const std::string path = d.sub("m.safetensors");
  std::vector<float> eb, ef;
  write_file_bytes(path, odd_file(50001, 30003, &eb, &ef));
  auto r = st::Reader::open(path);
  ASSERT_OK(r.status());
  const st::Header& h = (*r)->header();
  ASSERT_EQ(h.tensors.size(), 2u);
  ASSERT_NE(h.data_start() % 4096, 0u);
  const size_t fi = h.tensors[0].name == "f" ? 0 : 1, bi = 1 - fi;
  auto s = open_or_die(small_options(d.make_sub("store")));
  std::vector<float> zeros(50001, 0.0f);
  ASSERT_OK(s->put("b32", zeros.data(), TensorDesc{DType::kFloat32, {50001}}));
  std::vector<float> mem_b(50001), mem_f(30003 - 5);
  std::vector<st::CopyTarget> ts(3);
  ts[0] = {bi, 0, UINT64_MAX, DType::kFloat32, mem_b.data(), "", 0};
  ts[1] = {bi, 0, UINT64_MAX, DType::kFloat32, nullptr, "b32", 0};
  ts[2] = {fi, 5, UINT64_MAX, DType::kFloat32, mem_f.data(), "", 0};
  st::StreamOptions o;
  o.piece_bytes = 12288;  // many pieces, odd superset heads
  o.pieces = 3;
  auto stats = st::copy_tensors(**r, ts, s.get(), o);
  ASSERT_OK(stats.status());
  EXPECT_EQ(mem_b, eb);
  EXPECT_EQ(mem_f, std::vector<float>(ef.begin() + 5, ef.end()));
  std::vector<float> got(50001);
  ASSERT_OK(s->get("b32", got.data(), TensorDesc{DType::kFloat32, {50001}}));
  EXPECT_EQ(got, eb);
  EXPECT_EQ(stats->bytes_written, 2 * 50001 * 4 + 29998 * 4u);
  // Errors: a conversion that is not floating, a range past the tensor, a missing key.
  ts = {{bi, 0, UINT64_MAX, DType::kInt32, mem_b.data(), "", 0}};
  Status e = st::copy_tensors(**r, ts, s.get(), o).status();
  EXPECT_NE(e.message().find("tensor 'b': cannot convert bf16 to int32"), std::string::npos) << e.message();
  ts = {{fi, 0, 30004, DType::kFloat32, mem_f.data(), "", 0}};
  e = st::copy_tensors(**r, ts, s.get(), o).status();
  EXPECT_NE(e.message().find("elements [0, 30004) out of its 30003"), std::string::npos) << e.message();
  ts = {{fi, 0, UINT64_MAX, DType::kFloat32, nullptr, "nope", 0}};
  e = st::copy_tensors(**r, ts, s.get(), o).status();
  EXPECT_EQ(e.code(), StatusCode::kNotFound) << e.to_string();
}

TEST(Safetensors, OpenNamesTheFileOfATruncatedHeader) {
  TempDir d;
  const std::string path = d.sub("t.safetensors");
  std::string img = image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", std::string(8, '\0'));
  write_file_bytes(path, img.substr(0, 40));
  Status s = st::Reader::open(path).status();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("'" + path + "': header bytes [8, 62) run past the end of the file at byte 40"),
            std::string::npos)
      << s.message();
  EXPECT_EQ(st::Reader::open(d.sub("none")).status().code(), StatusCode::kNotFound);
}

TEST(Safetensors, WriteFileStreamsMemoryAndStoreObjectsAndReadsBack) {
  TempDir d;
  auto s = open_or_die(small_options(d.make_sub("store")));
  const uint64_t n = 300001;  // fp32 object of ~1.2 MB: several 64 KiB pieces
  std::vector<float> big(n);
  for (uint64_t i = 0; i < n; ++i) big[i] = static_cast<float>(i) * 0.001f - 3.0f;
  ASSERT_OK(s->put("p/w", big.data(), TensorDesc{DType::kFloat32, {n}}));
  const int64_t counts[3] = {1, 2, 3};
  const uint8_t flags[5] = {1, 0, 1, 1, 0};
  std::vector<st::WriteSource> src(4);
  src[0] = {"w", DType::kFloat32, {n}, DType::kFloat32, nullptr, "p/w", 0};
  src[1] = {"w_bf16", DType::kBFloat16, {n}, DType::kFloat32, nullptr, "p/w", 0};
  src[2] = {"counts", DType::kInt64, {3}, DType::kInt64, counts, "", 0};
  src[3] = {"flags", DType::kUInt8, {5}, DType::kUInt8, flags, "", 0};
  st::StreamOptions o;
  o.piece_bytes = 65536;
  o.pieces = 2;
  const std::string path = d.sub("out.safetensors");
  auto w = st::write_file(path, src, {{"format", "pt"}}, s.get(), o);
  ASSERT_OK(w.status());
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  const std::string img = read_file_bytes(path);
  EXPECT_EQ(w->bytes_written, img.size());
  auto h = st::parse(img, img.size(), path);
  ASSERT_OK(h.status());
  EXPECT_EQ(h->data_start(), 4096u);
  // The reference layout: counts (I64), w (F32), w_bf16 (BF16), flags (U8).
  std::vector<std::string> order;
  for (const auto& e : h->tensors) order.push_back(e.name);
  EXPECT_EQ(order, (std::vector<std::string>{"counts", "w", "w_bf16", "flags"}));
  const st::TensorEntry* e = h->find("w");
  EXPECT_EQ(img.substr(h->data_start() + e->begin, e->nbytes()), bytes_of(big.data(), 4 * n));
  e = h->find("counts");
  EXPECT_EQ(img.substr(h->data_start() + e->begin, 24), bytes_of(counts, 24));
  e = h->find("flags");
  EXPECT_EQ(img.substr(h->data_start() + e->begin, 5), bytes_of(flags, 5));
  e = h->find("w_bf16");
  std::vector<uint16_t> want(n);
  ASSERT_OK(st::convert(big.data(), DType::kFloat32, want.data(), DType::kBFloat16, n));
  EXPECT_EQ(img.substr(h->data_start() + e->begin, 2 * n), bytes_of(want.data(), 2 * n));
  // Errors: a name twice; a missing store object leaves no file behind.
  src[1].name = "w";
  Status err = st::write_file(d.sub("dup.safetensors"), src, {}, s.get(), o).status();
  EXPECT_NE(err.message().find("tensor 'w': a tensor name must be non-empty"), std::string::npos);
  src[1] = {"x", DType::kFloat32, {4}, DType::kFloat32, nullptr, "missing", 0};
  err = st::write_file(d.sub("miss.safetensors"), src, {}, s.get(), o).status();
  EXPECT_EQ(err.code(), StatusCode::kNotFound) << err.to_string();
  EXPECT_FALSE(std::filesystem::exists(d.sub("miss.safetensors")));
  EXPECT_FALSE(std::filesystem::exists(d.sub("miss.safetensors.tmp")));
}

TEST(Safetensors, OpenRangesReadsCallerGivenRangesOfAnyFile) {
  TempDir d;
  const std::string path = d.sub("blob.bin");
  std::vector<float> v(1000);
  for (int i = 0; i < 1000; ++i) v[i] = static_cast<float>(i) - 500.0f;
  write_file_bytes(path, "zip-like prefix!" + bytes_of(v.data(), 4000));  // 16-byte prefix
  // two views of one storage, overlapping, at odd offsets
  std::vector<st::TensorEntry> es(2);
  es[0] = {"a", st::StDType::kF32, {10, 3}, 16 + 4 * 7, 16 + 4 * 37};
  es[1] = {"b", st::StDType::kF32, {40}, 16 + 4 * 20, 16 + 4 * 60};
  auto r = st::Reader::open_ranges(path, es);
  ASSERT_OK(r.status());
  EXPECT_TRUE((*r)->header().raw);
  EXPECT_EQ((*r)->header().tensors[0].name, "a");
  std::vector<double> a(30), b(40);
  std::vector<st::CopyTarget> ts = {{0, 0, UINT64_MAX, DType::kFloat64, a.data(), "", 0},
                                    {1, 0, UINT64_MAX, DType::kFloat64, b.data(), "", 0}};
  ASSERT_OK(st::copy_tensors(**r, ts, nullptr).status());
  for (int i = 0; i < 30; ++i) EXPECT_EQ(a[i], v[7 + i]);
  for (int i = 0; i < 40; ++i) EXPECT_EQ(b[i], v[20 + i]);
  es[1].end += 4;
  Status s = st::Reader::open_ranges(path, es).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("tensor 'b': 164 bytes for 160 of its shape and dtype"), std::string::npos)
      << s.message();
  es[1] = {"b", st::StDType::kF32, {1000}, 16, 4016 + 4};
  s = st::Reader::open_ranges(path, es).status();
  EXPECT_NE(s.message().find("bytes [16, 4020) are not inside the file's 4016"), std::string::npos)
      << s.message();
}

}  // namespace
}  // namespace strata
