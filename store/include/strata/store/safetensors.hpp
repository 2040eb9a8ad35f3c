// strata::store — the safetensors checkpoint format (Hugging Face): its header parser and
// writer, and reading / writing its tensors at the drive's speed through strata's IoEngine.
//
// Why in store/: this is tensor file I/O — O_DIRECT reads and writes through the IoEngine,
// pinned buffers from a PinnedPool, tensors streamed into and out of Store objects — the
// store's own trade; the formats are byte layouts with no dependency above the store (the
// Python layer maps model names onto keys). Spec: github.com/huggingface/safetensors
// (README "Format"): 8 bytes little-endian u64 N, N bytes of UTF-8 JSON (may be padded with
// trailing spaces), then the data. The JSON object maps each tensor name to {"dtype",
// "shape", "data_offsets": [begin, end)} (bytes relative to the data start; the tensors
// cover the data whole, without holes or overlaps) plus an optional "__metadata__" object
// of string values. The header is padded to 8 bytes only, so tensors are not page-aligned:
// readers here read aligned supersets of each range (Reader::read_superset_async).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "strata/base/dtype.hpp"
#include "strata/base/future.hpp"
#include "strata/base/status.hpp"

namespace strata {
class IoEngine;
class IoFile;
class Store;
}  // namespace strata

namespace strata::safetensors {

/// Element types of the format (its "dtype" strings), in the order of the reference
/// implementation's `Dtype` enum (the writer's sort order).
enum class StDType : uint8_t {
  kBool, kU8, kI8, kF8_E5M2, kF8_E4M3, kI16, kU16, kF16, kBF16, kI32, kU32, kF32, kF64,
  kI64, kU64,
};
/// "BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "I16", "U16", "F16", "BF16", "I32", "U32",
/// "F32", "F64", "I64", "U64".
std::string_view dtype_name(StDType t) noexcept;
/// Bytes per element (1, 2, 4 or 8).
size_t dtype_size(StDType t) noexcept;
/// The name's dtype; nullopt for a string that is none of dtype_name()'s.
std::optional<StDType> parse_dtype(std::string_view name) noexcept;
/// strata's DType of the same bytes; nullopt for F8_*, U16, U32, U64 (strata has none).
std::optional<DType> to_strata(StDType t) noexcept;
/// The format's dtype of a strata DType (fp32 -> F32, bf16 -> BF16, bool -> BOOL, ...).
StDType from_strata(DType t) noexcept;

/// One tensor of a file, as its header describes it.
struct TensorEntry {
  std::string name;
  StDType dtype = StDType::kU8;
  std::vector<uint64_t> shape;
  uint64_t begin = 0;  ///< data_offsets[0]: first byte, relative to the data start
  uint64_t end = 0;    ///< data_offsets[1]: one past the last byte
  uint64_t numel() const;  ///< product of shape (1 for a scalar, shape [])
  uint64_t nbytes() const { return end - begin; }
};

/// A parsed header. `tensors` are sorted by `begin` (the order of the bytes in the file).
struct Header {
  uint64_t header_nbytes = 0;  ///< N: the JSON's bytes, padding included
  uint64_t file_nbytes = 0;    ///< size of the file the header was parsed against
  std::vector<TensorEntry> tensors;
  std::vector<std::pair<std::string, std::string>> metadata;  ///< "__metadata__", by key
  /// A header the caller gave (Reader::open_ranges): `tensors` offsets are file offsets
  /// and may overlap or leave gaps (views of one storage, other entries of a zip archive).
  bool raw = false;
  uint64_t data_start() const { return raw ? 0 : 8 + header_nbytes; }  ///< file offset of the data
  /// The entry named `name`; nullptr when absent. O(log n).
  const TensorEntry* find(std::string_view name) const;
  std::vector<size_t> by_name;  ///< indices of `tensors` sorted by name (find()'s index)
};

/// The reference implementation's bound on N (MAX_HEADER_SIZE: 100,000,000 bytes).
inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;

/// N from the first 8 bytes of a file of `file_nbytes` bytes (`prefix` holds
/// min(8, file_nbytes) of them).
/// \error DataLoss naming `path` and byte offsets: a file shorter than 8 bytes ("ends at
///     byte S, inside the 8-byte header length"), N > kMaxHeaderBytes, or 8 + N past the
///     end of the file ("header bytes [8, 8+N) run past the end of the file at byte S").
Result<uint64_t> parse_header_length(std::string_view prefix, uint64_t file_nbytes,
                                     std::string_view path);

/// Parses the header JSON `json` (the N bytes after the length) of a file of
/// `file_nbytes` bytes and validates it against the format: a JSON object (first byte
/// '{'), valid UTF-8, no key twice; each entry but "__metadata__" an object with "dtype"
/// (one of dtype_name()'s), "shape" (array of integers >= 0) and "data_offsets" (two
/// integers, begin <= end) whose size is numel x dtype size; the entries sorted by begin
/// cover [0, file_nbytes - 8 - N) exactly: no overlap, no hole, nothing after the last;
/// "__metadata__" an object of strings. Other fields of an entry are ignored.
/// \error DataLoss whose message names `path`, the tensor, and the file byte offsets at
///     fault (a JSON syntax error: the byte it was found at).
/// \threadsafety pure function.
Result<Header> parse_header(std::string_view json, uint64_t file_nbytes, std::string_view path);

/// parse_header_length() then parse_header() over the first bytes of a file: `bytes` holds
/// min(file_nbytes, 8 + N) leading bytes (fewer: DataLoss naming the offset).
Result<Header> parse(std::string_view bytes, uint64_t file_nbytes, std::string_view path);

/// The 8-byte length and the JSON of a file holding `tensors` (their begin/end as given)
/// and `metadata`, the JSON padded with spaces so that 8 + N is a multiple of
/// `data_alignment` (a power of two >= 8; the spec allows trailing spaces): the data then
/// starts aligned for O_DIRECT. Keys sorted (std::map order).
std::string format_header(const std::vector<TensorEntry>& tensors,
                          const std::vector<std::pair<std::string, std::string>>& metadata,
                          uint64_t data_alignment = 4096);

/// The order in which the reference writer (`safetensors.serialize`) lays out tensors:
/// dtype descending in StDType order (8-byte types first), then name ascending; with
/// element sizes powers of two, every tensor then begins at a multiple of its element
/// size. Returns the permutation of `entries` (only dtype and name are read).
std::vector<size_t> layout_order(const std::vector<TensorEntry>& entries);

/// An open safetensors file: its parsed header and O_DIRECT reads of its bytes.
/// \threadsafety immutable after open(); read_superset_async may be called concurrently.
class Reader {
 public:
  /// Opens and parses `path` (the header read with one aligned superset read).
  /// \param engine the engine to read through; nullptr: one of IoEngineOptions::from_env().
  /// \error NotFound / PermissionDenied / IoError naming the path; DataLoss from parse().
  static Result<std::shared_ptr<Reader>> open(const std::string& path,
                                              std::shared_ptr<IoEngine> engine = nullptr);
  /// Opens `path` (any file) with a header the caller gives: `tensors` name byte ranges
  /// [begin, end) of the file itself (e.g. the uncompressed storages of a torch.save zip
  /// archive), kept in the given order, names unique; copy_tensors then reads them as it
  /// reads a safetensors file's tensors.
  /// \error InvalidArgument naming the file and the tensor: a name twice, a range past the
  ///     end of the file, end - begin != numel x dtype size; the engine's open errors.
  static Result<std::shared_ptr<Reader>> open_ranges(const std::string& path,
                                                     std::vector<TensorEntry> tensors,
                                                     std::shared_ptr<IoEngine> engine = nullptr);
  ~Reader();

  const std::string& path() const { return path_; }
  const Header& header() const { return header_; }
  const std::shared_ptr<IoEngine>& engine() const { return engine_; }
  /// DIO alignment of offsets and lengths (bytes; 4096 where none is reported).
  uint64_t alignment() const { return align_; }
  /// Bytes a buffer needs for read_superset_async(file_offset, nbytes): the aligned
  /// superset's length.
  uint64_t superset_nbytes(uint64_t file_offset, uint64_t nbytes) const;

  /// Reads the aligned superset of file bytes [file_offset, file_offset + nbytes) --
  /// [floor(file_offset), min(ceil(end), file size)) at alignment() -- into `buf`.
  /// \param buf aligned to the engine's memory alignment (4096 does), at least
  ///     superset_nbytes() bytes; valid until the future is ready.
  /// \returns future of the head: the wanted bytes are at buf + head.
  /// \error OutOfRange past the end of the file; the engine's errors (path, offset, errno).
  Future<uint64_t> read_superset_async(uint64_t file_offset, uint64_t nbytes, void* buf) const;

 private:
  Reader() = default;
  /// A reader of `path` opened through `engine` (or a default one), its header empty.
  static Result<std::shared_ptr<Reader>> open_file(const std::string& path,
                                                   std::shared_ptr<IoEngine> engine);
  std::string path_;
  Header header_;
  std::shared_ptr<IoEngine> engine_;
  std::shared_ptr<IoFile> file_;
  uint64_t align_ = 4096;
};

/// Where one tensor (or an element range of it) goes, for copy_tensors().
struct CopyTarget {
  size_t tensor = 0;           ///< index into Reader::header().tensors
  uint64_t elem_begin = 0;     ///< first element of the tensor to copy
  uint64_t elem_end = UINT64_MAX;  ///< one past the last (UINT64_MAX: the tensor's numel)
  DType dtype = DType::kFloat32;   ///< the destination's element type (converted in flight)
  void* memory = nullptr;      ///< destination memory (elements), or nullptr: store object
  std::string key;             ///< store object written with write_range (memory == nullptr)
  uint64_t key_offset_bytes = 0;   ///< first byte of the object written
};

/// Options of copy_tensors() and write_file().
struct StreamOptions {
  /// Bytes per piece (rounded up to the DIO alignment): the unit read, converted and
  /// written. Default 8 MiB. (STRATA_CHECKPOINT_PIECE_BYTES)
  uint64_t piece_bytes = 8ull << 20;
  /// Pieces in flight: host memory is about 2 x pieces x piece_bytes (a pinned pool made
  /// for the call). Default 4. (STRATA_CHECKPOINT_PIECES)
  uint32_t pieces = 4;
  /// write_file: fdatasync the file and its directory before it is renamed into place.
  bool durable = true;
  /// Defaults overridden by the variables named above. \error InvalidArgument naming the
  /// variable on a malformed value.
  static Result<StreamOptions> from_env();
};

/// What a copy or a write moved.
struct StreamStats {
  uint64_t bytes_read = 0;     ///< file bytes read (supersets included) / store bytes read
  uint64_t bytes_written = 0;  ///< bytes written to memory/store / to the file
  double seconds = 0;          ///< wall time of the call
};

/// Element conversion between the floating dtypes (fp32, fp16, bf16, fp64; fp32 <-> bf16 /
/// fp16 round to nearest even, as torch's `Tensor.to`) and a plain copy for equal dtypes.
/// \error InvalidArgument naming both dtypes when they differ and either is not floating.
Status convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, uint64_t numel);

/// Copies tensors of `reader`'s file into memory or store objects, streaming: pieces of
/// aligned superset reads through the reader's engine (several in flight, so the drive
/// sees queue depth), each converted to the target's dtype on the calling thread, then
/// stored (Store::write_range_async, several in flight) or written into `memory`. Host
/// memory: a pinned pool of about 2 x pieces x piece_bytes; never the file or a tensor
/// whole.
/// \param store needed when a target has no `memory` (else may be null).
/// \error InvalidArgument: a target's tensor index or element range out of range, a dtype
///     the format's dtype cannot be converted to (naming the tensor, e.g. I64 -> fp32), a
///     store target without a store; the store's errors (NotFound, OutOfRange naming the
///     key); the engine's (path, offset, errno). After an error, targets may hold part of
///     the data.
/// \threadsafety one call per reader at a time is not required; the targets' memory and
///     objects must not be used by others meanwhile.
Result<StreamStats> copy_tensors(const Reader& reader, const std::vector<CopyTarget>& targets,
                                 Store* store, const StreamOptions& options = {});

/// One tensor of a file write_file() writes.
struct WriteSource {
  std::string name;            ///< its name in the file (unique)
  DType dtype = DType::kFloat32;  ///< its dtype in the file
  std::vector<uint64_t> shape;
  DType src_dtype = DType::kFloat32;  ///< the source's element type (converted in flight)
  const void* memory = nullptr;  ///< source elements in memory, or nullptr: store object
  std::string key;               ///< store object read with read_range (memory == nullptr)
  uint64_t key_offset_bytes = 0; ///< first byte of the object read
};

/// Writes a safetensors file at `path`: the header (format_header, padded so that the data
/// starts at a multiple of 4096), then each tensor's bytes in layout_order(), streamed in
/// pieces from memory or store objects (Store::read_range_async, converted to the file's
/// dtype) and written with O_DIRECT through `engine` (several pieces in flight), into
/// `path`.tmp; then fdatasync (options.durable), rename over `path`, fsync of the
/// directory. Host memory: a pinned pool of about 2 x pieces x piece_bytes.
/// \param engine nullptr: one of IoEngineOptions::from_env().
/// \returns the stats; the file's header is parse()-able and its tensors hold the sources.
/// \error InvalidArgument: a name twice or empty or "__metadata__", a conversion that is
///     not floating -> floating; the store's and the engine's errors (the .tmp file is
///     removed then; `path` is untouched).
Result<StreamStats> write_file(const std::string& path, const std::vector<WriteSource>& sources,
                               const std::vector<std::pair<std::string, std::string>>& metadata,
                               Store* store, const StreamOptions& options = {},
                               std::shared_ptr<IoEngine> engine = nullptr);

}  // namespace strata::safetensors
