#pragma once
/// \file safetensors.hpp
/// The safetensors format (Hugging Face): reading with dtype conversion and
/// row-range reads for sharded loading, and atomic writing.
///
/// Layout of a file:
///   8 bytes     N, the header length, little-endian unsigned 64-bit
///   N bytes     UTF-8 JSON object, possibly padded with trailing spaces:
///                 {"<name>": {"dtype": "F32", "shape": [2, 3],
///                             "data_offsets": [begin, end]}, ...,
///                  "__metadata__": {"<key>": "<value>", ...}}   (optional)
///   the rest    the byte buffer; a tensor's bytes are [begin, end) of it,
///               row-major, little-endian.
/// summa converts F32, F64, BF16 and F16 to float or double on reading and
/// writes F32, F64, BF16 and F16. Other dtypes of the format (BOOL, U8, I8,
/// I16, U16, I32, U32, I64, U64, F8_E4M3, F8_E5M2) are accepted in a file
/// (so that a checkpoint carrying, e.g., integer buffers opens) but cannot be
/// read into floating point; any other dtype string is an error.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "summa/core/types.hpp"
#include "summa/io/atomic_file.hpp"

namespace summa::io {

// ---------------------------------------------------------------- dtypes

/// Element types summa converts. `other` marks a valid safetensors dtype that
/// cannot be read into floating point (see the file comment).
enum class TensorDType : std::uint8_t { f32, f64, bf16, f16, other };

/// The safetensors spelling: "F32", "F64", "BF16", "F16" ("?" for other).
std::string_view safetensors_name(TensorDType dtype);
/// Bytes per element (0 for other).
std::size_t element_size(TensorDType dtype);

/// Round-to-nearest-even conversions between float and the 16-bit formats
/// (NaN stays NaN, overflow becomes infinity, F16 subnormals are exact).
std::uint16_t float_to_bf16(float value);
float bf16_to_float(std::uint16_t bits);
std::uint16_t float_to_f16(float value);
float f16_to_float(std::uint16_t bits);

// ---------------------------------------------------------------- reading

/// One tensor as described by the header.
struct TensorInfo {
  std::string name;
  /// The dtype as spelled in the file ("F32", "I64", ...).
  std::string dtype_name;
  /// The convertible dtype, or TensorDType::other.
  TensorDType dtype = TensorDType::other;
  /// Bytes per element of dtype_name.
  std::size_t element_bytes = 0;
  std::vector<index_t> shape;
  /// Byte range [data_begin, data_end) relative to the start of the buffer.
  std::uint64_t data_begin = 0, data_end = 0;

  /// Product of the dimensions (1 for a scalar).
  index_t elements() const;
  /// Rows as read_rows() counts them: shape[0] for 2 or more dimensions,
  /// 1 for a 1-D tensor or a scalar (a 1-D tensor is one row, as
  /// summa::ParamShard sees it).
  index_t rows() const;
  /// Elements per row: elements() / rows() (0 when rows() is 0).
  index_t row_elements() const;
};

/// A safetensors file opened for reading. The constructor reads and checks
/// the whole header (not the data); reads then fetch only the bytes they
/// need. Every error is a summa::Error whose message starts with
/// "safetensors file '<path>':" and names the problem: file shorter than 8
/// bytes, header length larger than the file or than 100 MB, header not valid
/// JSON or not an object, an unknown dtype, a shape that is not an array of
/// non-negative integers, data_offsets outside the buffer or with end <
/// begin, a byte size other than elements · element size, overlapping
/// tensors, a key given twice in one object (duplicate names), a malformed
/// "__metadata__"; and on reading, a
/// missing tensor, a dtype that cannot be converted, an output of the wrong
/// size or rows outside the tensor.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::filesystem::path& path);

  const std::filesystem::path& path() const { return path_; }
  /// Every tensor, sorted by name.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  bool contains(std::string_view name) const;
  /// Throws when there is no tensor called `name`.
  const TensorInfo& info(std::string_view name) const;
  /// The "__metadata__" map (empty when absent).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  /// Byte position of the buffer in the file (8 + header length).
  std::uint64_t data_start() const { return data_start_; }

  /// All elements of tensor `name`, converted to T (float or double);
  /// out.size() must equal its element count.
  template <class T>
  void read(std::string_view name, std::span<T> out) const;
  /// The same into a new vector.
  template <class T>
  std::vector<T> read(std::string_view name) const;
  /// Rows [row_begin, row_begin + rows) (see TensorInfo::rows()), converted
  /// to T; reads only those rows' bytes. out.size() must be rows ·
  /// row_elements().
  template <class T>
  void read_rows(std::string_view name, index_t row_begin, index_t rows, std::span<T> out) const;

 private:
  std::string where() const;
  template <class T>
  void read_range(const TensorInfo& t, index_t first, index_t count, std::span<T> out) const;

  std::filesystem::path path_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
  std::uint64_t data_start_ = 0;
  mutable std::ifstream in_;
};

// ---------------------------------------------------------------- writing

/// Name, shape and stored dtype of a tensor to write.
struct TensorSpec {
  std::string name;
  std::vector<index_t> shape;
  TensorDType dtype = TensorDType::f32;
};

/// A tensor to write: its spec and its row-major elements (float or double,
/// converted to spec.dtype; BF16 and F16 round from float, as PyTorch's
/// conversions do, so double goes through float first).
struct TensorEntry {
  TensorSpec spec;
  std::variant<std::span<const float>, std::span<const double>> data;
};

/// Writes a safetensors file incrementally: the header is laid out from the
/// specs up front (tensors sorted by name, their bytes in that order, the
/// header padded with spaces to a multiple of 8 bytes), tensors are then
/// written in any order, and commit() puts the temporary file (in the
/// target's directory) in place of `path` (AtomicFile: fsync, rename, fsync
/// of the directory). Without commit() (an exception, say) the destructor
/// removes the temporary file, so `path` is either the old file or the
/// complete new one. Errors name the file: an empty, duplicate or reserved
/// ("__metadata__") name, a name or metadata text that is not UTF-8, a
/// negative dimension, an unsupported dtype, data of the wrong size, a tensor
/// written twice or never, I/O failure (with the system's reason).
class SafetensorsWriter {
 public:
  SafetensorsWriter(const std::filesystem::path& path, std::vector<TensorSpec> tensors,
                    const std::map<std::string, std::string>& metadata = {});
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  /// Writes tensor `name` (T = float or double), converting to its dtype.
  template <class T>
  void write(std::string_view name, std::span<const T> data);
  /// Checks every tensor was written, then fsyncs and renames into place.
  void commit();

 private:
  struct Slot {
    TensorSpec spec;
    std::uint64_t begin = 0, end = 0;
    bool written = false;
  };
  std::string where() const;
  Slot& slot(std::string_view name);

  std::filesystem::path path_;
  std::vector<Slot> slots_;
  std::uint64_t data_start_ = 0;
  std::optional<AtomicFile> file_;
  bool committed_ = false;
};

/// Writes `tensors` and `metadata` to `path` atomically (SafetensorsWriter).
void write_safetensors(const std::filesystem::path& path, const std::vector<TensorEntry>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

extern template void SafetensorsFile::read<float>(std::string_view, std::span<float>) const;
extern template void SafetensorsFile::read<double>(std::string_view, std::span<double>) const;
extern template std::vector<float> SafetensorsFile::read<float>(std::string_view) const;
extern template std::vector<double> SafetensorsFile::read<double>(std::string_view) const;
extern template void SafetensorsFile::read_rows<float>(std::string_view, index_t, index_t,
                                                       std::span<float>) const;
extern template void SafetensorsFile::read_rows<double>(std::string_view, index_t, index_t,
                                                        std::span<double>) const;
extern template void SafetensorsWriter::write<float>(std::string_view, std::span<const float>);
extern template void SafetensorsWriter::write<double>(std::string_view, std::span<const double>);

}  // namespace summa::io
