// Writes the seed corpora of the fuzz targets from real encodings (run by hand after a
// format change; the output is committed under tests/fuzz/corpus):
//   fuzz_seeds <corpus dir>
//   catalog/            INSERT statements of the catalogs of real stores (puts of several
//                       dtypes, shapes and tiers, multi-chunk objects, two NVMe directories,
//                       a partitioned object, an offloaded optimizer's objects)
//   partition_record/   records of partitioned objects (encode_partition_meta)
//   checkpoint_record/  the record of real offloaded optimizers (checkpoint())
//   key_text/           keys and escaped keys
//   c_api/              byte strings that drive a few calls each
//   safetensors/        files of write_file (a store object, memory, bf16 conversion) and
//                       format_header (every dtype, 8-byte padding, an empty header)
#include <sqlite3.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "fuzz_check.hpp"
#include "fuzz_temp_dir.hpp"
#include "key_text.hpp"
#include "partition_record.hpp"
#include "strata/optimizer/offload.hpp"
#include "strata/store/safetensors.hpp"
#include "strata/store/store.hpp"

namespace fs = std::filesystem;
using namespace strata;

namespace {

void write(const fs::path& file, const std::string& bytes) {
  fs::create_directories(file.parent_path());
  std::ofstream(file, std::ios::binary) << bytes;
}

template <class T>
T must(Result<T> r) {
  FUZZ_CHECK(r.ok(), "%s", r.status().to_string().c_str());
  return std::move(r).value();
}
void must(Status s) { FUZZ_CHECK(s.ok(), "%s", s.to_string().c_str()); }

/// The rows of the catalog at `db_path` as INSERT statements.
std::string dump_catalog(const std::string& db_path) {
  sqlite3* db = nullptr;
  FUZZ_CHECK(sqlite3_open_v2(db_path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr) == SQLITE_OK, "open");
  std::string out;
  for (const char* table : {"meta", "objects", "chunks"}) {
    const std::string q = std::string("SELECT 'INSERT INTO ") + table + " VALUES(' || " +
                          (std::string(table) == "meta"
                               ? "quote(name) || ',' || quote(value)"
                               : std::string(table) == "objects"
                                     ? "quote(key) || ',' || dtype || ',' || quote(shape) || ',' || nbytes || ',' || first_dir"
                                     : "quote(key) || ',' || idx || ',' || dir || ',' || offset || ',' || nbytes || ',' || checksum") +
                          " || ');' FROM " + table;
    sqlite3_stmt* s = nullptr;
    FUZZ_CHECK(sqlite3_prepare_v2(db, q.c_str(), -1, &s, nullptr) == SQLITE_OK, "%s", sqlite3_errmsg(db));
    while (sqlite3_step(s) == SQLITE_ROW) out += std::string(reinterpret_cast<const char*>(sqlite3_column_text(s, 0))) + "\n";
    sqlite3_finalize(s);
  }
  sqlite3_close(db);
  return out;
}

std::shared_ptr<Store> open_store(const std::string& root, std::vector<std::string> dirs, uint64_t chunk) {
  StoreOptions o;
  o.path = root;
  o.nvme_dirs = std::move(dirs);
  o.chunk_bytes = chunk;
  o.host_budget_bytes = 8 << 20;
  o.staging_bytes = 1 << 20;
  o.numa_node = -2;
  return std::shared_ptr<Store>(must(Store::open(o)).release());
}

void catalog_seeds(const fs::path& out) {
  const std::string tmp = fuzz::scratch_dir();
  std::vector<uint8_t> bytes(3 * 4096 + 100, 7);
  {  // one directory: dtypes, a scalar, an empty tensor, a key with odd bytes
    auto s = open_store(tmp + "/a", {}, 4096);
    must(s->put("w", bytes.data(), {DType::kFloat32, {4, 8}}));
    must(s->put("scalar", bytes.data(), {DType::kFloat64, {}}));
    must(s->put("empty", bytes.data(), {DType::kInt8, {0, 5}}));
    must(s->put("multi/chunk", bytes.data(), {DType::kUInt8, {3 * 4096 + 100}}));
    must(s->put(std::string("k\n\x01\xff", 4), bytes.data(), {DType::kBFloat16, {2, 1, 3}}));
    must(s->flush());
  }
  write(out / "one_dir.sql", dump_catalog(tmp + "/a/catalog.db"));
  {  // two NVMe directories, one outside the root; an overwrite and a delete
    auto s = open_store(tmp + "/b", {tmp + "/b/d0", tmp + "/b-outside"}, 8192);
    must(s->put("x", bytes.data(), {DType::kInt32, {3000}}));
    must(s->put("y", bytes.data(), {DType::kInt16, {5, 7}}));
    PutOptions ow;
    ow.overwrite = true;
    must(s->put("y", bytes.data(), {DType::kInt16, {7, 5}}, ow));
    must(s->put("gone", bytes.data(), {DType::kBool, {9}}));
    must(s->remove("gone"));
    must(s->flush());
  }
  write(out / "two_dirs.sql", dump_catalog(tmp + "/b/catalog.db"));
  {  // an offloaded optimizer's objects and record
    auto s = open_store(tmp + "/c", {}, 4096);
    auto factory = must(optimizer::builtin_rule_factory("adamw"));
    auto opt = must(optimizer::OffloadedOptimizer::create(s, factory, {{"lr", 0.01}}));
    std::vector<float> init(1500, 0.5f), grad(1500, 0.25f);
    auto a = must(opt->add_param("a", 1500, init.data(), 0, optimizer::Placement::kNvme));
    must(opt->set_grad(a, grad.data(), DType::kFloat32));
    must(opt->step().status());
    must(opt->checkpoint());
    must(opt->close());
  }
  write(out / "optimizer.sql", dump_catalog(tmp + "/c/catalog.db"));
}

void checkpoint_seeds(const fs::path& out) {
  const std::string tmp = fuzz::scratch_dir();
  auto s = open_store(tmp + "/ckpt", {}, 4096);
  int n = 0;
  for (const char* rule : {"adam", "sgd", "adagrad", "lion"}) {
    auto factory = must(optimizer::builtin_rule_factory(rule));
    optimizer::OffloadOptions oo;
    oo.key_prefix = std::string(rule) + "/";
    oo.host_budget_bytes = 1 << 20;
    auto opt = must(optimizer::OffloadedOptimizer::create(s, factory, {{"lr", 0.125}}, oo));
    must(opt->add_param_group({{"lr", 1e-300}, {"weight_decay", 0.5}}).status());
    std::vector<float> init(300, 1.0f), grad(300, -0.5f);
    auto a = must(opt->add_param("layer.0/w", 300, init.data(), 0, optimizer::Placement::kHost));
    auto b = must(opt->add_param("b", 7, init.data(), 1, optimizer::Placement::kNvme));
    must(opt->set_grad(a, grad.data(), DType::kFloat32));
    must(opt->set_grad(b, grad.data(), DType::kFloat32));
    for (int i = 0; i <= n; ++i) must(opt->step().status());
    must(opt->checkpoint());
    const std::string key = oo.key_prefix + "meta";
    auto info = must(s->stat(key));
    std::string text(info.nbytes, '\0');
    must(s->get_bytes(key, text.data(), text.size()));
    write(out / (std::string(rule) + ".txt"), text);
    must(opt->close());
    ++n;
  }
}

void partition_seeds(const fs::path& out) {
  struct Case {
    const char* name;
    TensorDesc d;
    int world, rank;
  };
  const Case cases[] = {{"matrix_rank1_of_4", {DType::kFloat32, {1000, 7}}, 4, 1},
                        {"scalar", {DType::kFloat64, {}}, 1, 0},
                        {"fewer_elements_than_ranks", {DType::kInt8, {3}}, 8, 7},
                        {"empty", {DType::kBFloat16, {0, 3}}, 2, 0}};
  for (const auto& c : cases) {
    auto l = must(partition_layout(c.d.numel(), c.world));
    auto b = store_detail::encode_partition_meta(l, c.rank, c.d);
    write(out / c.name, std::string(b.begin(), b.end()));
  }
}

void key_text_seeds(const fs::path& out) {
  const std::string keys[] = {"layer.0/weight", std::string("nul\0byte", 8), "tab\tnl\nback\\slash",
                              "\xc3\xa9t\xc3\xa9 \xf0\x9f\x98\x80", "\xc2\x85 c1 control", "\xff\xfe bad utf8"};
  int i = 0;
  for (const auto& k : keys) {
    write(out / ("key" + std::to_string(i)), k);
    write(out / ("escaped" + std::to_string(i++)), cli::escape_key(k));
  }
}

void c_api_seeds(const fs::path& out) {
  // FuzzedDataProvider reads integers from the end of the input and strings from the front:
  // random bytes of a few lengths reach every call kind.
  uint32_t x = 12345;
  for (int n : {16, 64, 256, 1024}) {
    std::string b(n, '\0');
    for (auto& c : b) c = static_cast<char>((x = x * 1103515245 + 12345) >> 16);
    write(out / ("bytes" + std::to_string(n)), b);
  }
}

void safetensors_seeds(const fs::path& out) {
  namespace st = strata::safetensors;
  // write_file's own output (header padded to 4096) from a store object and memory.
  const std::string tmp = fuzz::scratch_dir();
  auto s = open_store(tmp + "/st", {}, 4096);
  std::vector<float> w(6);
  for (int i = 0; i < 6; ++i) w[i] = 0.5f * static_cast<float>(i) - 1.0f;
  must(s->put("w", w.data(), TensorDesc{DType::kFloat32, {2, 3}}));
  const int64_t step[1] = {7};
  const uint8_t mask[3] = {1, 0, 1};
  std::vector<st::WriteSource> src = {
      {"layer.0.weight", DType::kFloat32, {2, 3}, DType::kFloat32, nullptr, "w", 0},
      {"layer.0.weight_bf16", DType::kBFloat16, {2, 3}, DType::kFloat32, nullptr, "w", 0},
      {"step", DType::kInt64, {}, DType::kInt64, step, "", 0},
      {"mask", DType::kBool, {3}, DType::kBool, mask, "", 0}};
  must(st::write_file(tmp + "/st.safetensors", src, {{"format", "pt"}}, s.get()).status());
  std::ifstream f(tmp + "/st.safetensors", std::ios::binary);
  write(out / "strata_written", std::string(std::istreambuf_iterator<char>(f), {}));
  // The reference writer's padding (8 bytes), every dtype, an empty tensor and metadata.
  std::vector<st::TensorEntry> es;
  uint64_t pos = 0;
  const char* names[] = {"BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "I16", "U16", "F16", "BF16",
                         "I32", "U32", "F32", "F64", "I64", "U64"};
  for (const char* n : names) {
    st::TensorEntry e{std::string("t.") + n, *st::parse_dtype(n), {2}, 0, 0};
    es.push_back(e);
  }
  es.push_back({"empty", st::StDType::kF32, {0, 4}, 0, 0});
  for (size_t i : st::layout_order(es)) {
    es[i].begin = pos;
    es[i].end = pos += es[i].numel() * st::dtype_size(es[i].dtype);
  }
  write(out / "every_dtype", st::format_header(es, {{"format", "pt"}, {"note", "\xc3\xa9"}}, 8) +
                                 std::string(pos, '\x5a'));
  write(out / "empty", st::format_header({}, {}, 8));
}

}  // namespace

int main(int argc, char** argv) {
  FUZZ_CHECK(argc == 2, "usage: fuzz_seeds <corpus dir>");
  const fs::path out = argv[1];
  catalog_seeds(out / "catalog");
  checkpoint_seeds(out / "checkpoint_record");
  partition_seeds(out / "partition_record");
  key_text_seeds(out / "key_text");
  c_api_seeds(out / "c_api");
  safetensors_seeds(out / "safetensors");
  std::printf("seeds written under %s\n", argv[1]);
  return 0;
}
