// The safetensors format (huggingface/safetensors), F32 only:
//
//   u64 little-endian  N, the header length in bytes
//   N bytes            JSON: {"__metadata__": {string: string, ...},
//                             "<name>": {"dtype": "F32", "shape": [...],
//                                        "data_offsets": [begin, end]}, ...}
//                      padded with spaces to a multiple of 8
//   data               raw little-endian floats; offsets are relative to the
//                      first byte after the header
//
// Checksums. Every file braid writes carries, for each tensor, the XXH3
// 64-bit hash (Debian's libxxhash) of its data bytes as 16 hex digits in
// __metadata__ under "xxh3:<tensor name>", and "checksums": "xxh3_64"
// (so that a file without tensors, too, says it carries them), and
// "xxh3:__metadata__", the hash of every other metadata key and value in key
// order. They live in the header of the file they protect, not in a
// manifest, so a file is checked alone: a weights file handed to
// --init-from, one shard, the consolidated file. The rest of the header is
// covered by its JSON parse and the checks below (a damaged name, shape or
// offset is refused by them); a damaged config value or step, which those
// would let through, by the metadata's own hash. (Files of an older braid
// lack that one and load without it.)
//
// Writing is atomic (AtomicFile). Reading maps the file (read-only, private)
// rather than copying it: the pages are the page cache's, which the kernel
// may drop and read again, so every rank that opens a whole checkpoint on
// resume holds none of it in its own memory beyond the tensor it copies
// out. (braid replaces files by rename, never in place; a file truncated by
// hand while it is open makes the reader fault.) Reading validates the whole file before
// anything is copied out, and every refusal is an InvalidUsage naming the
// file and the problem: truncated header length, header length past the end
// of the file, bad JSON, wrong dtype, offsets out of range or not matching
// the shape, bytes after the last tensor's data, a tensor whose data does
// not hash to its checksum (named), missing tensor, shape mismatch. A file
// with checksums must have one for every tensor; a file with none (written
// by another tool) reads unverified, and checksummed() says so, so callers
// that only ever read braid's own files (training checkpoints) refuse it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace braid {
struct WriteProgress;  // runtime/atomic_file.h
}  // namespace braid

namespace braid::trainer {

using Metadata = std::map<std::string, std::string>;

struct TensorToWrite {
  std::string name;
  std::vector<std::int64_t> shape;
  const float* data;
};

// Atomically (AtomicFile, which reports to `progress` when given one).
void write_safetensors(const std::filesystem::path& path, const std::vector<TensorToWrite>& tensors,
                       const Metadata& metadata, WriteProgress* progress = nullptr);

class SafetensorsFile {
 public:
  static SafetensorsFile read(const std::filesystem::path& path);

  const std::filesystem::path& path() const { return path_; }
  // Whether the file carried checksums (and all of them matched).
  bool checksummed() const { return checksummed_; }
  const Metadata& metadata() const { return metadata_; }
  // The metadata value, or an InvalidUsage naming the file and the key.
  const std::string& metadata_value(const std::string& key) const;
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const { return entries_.count(name) != 0; }
  // The tensor's shape; throws unless it exists.
  const std::vector<std::int64_t>& shape(const std::string& name) const;
  // Throws unless the tensor exists with exactly this shape.
  void check(const std::string& name, const std::vector<std::int64_t>& shape) const;
  // check(), then copies the tensor's floats to `out`.
  void copy(const std::string& name, const std::vector<std::int64_t>& shape, float* out) const;
  // XXH3-64 of what the file holds: of its header where it carries
  // checksums (they cover the data), else of the whole file. Equal for two
  // copies of one file, wherever they lie.
  std::uint64_t fingerprint() const;

 private:
  struct Entry {
    std::vector<std::int64_t> shape;
    std::uint64_t begin = 0, end = 0;  // into the data section
  };
  void parse_header(std::string_view header);
  void parse_metadata(const nlohmann::json& metadata);
  Entry parse_entry(const std::string& name, const nlohmann::json& entry) const;
  void check_trailing_bytes() const;
  void verify_checksums();
  [[noreturn]] void fail(const std::string& problem) const;

  struct Mapping;
  std::filesystem::path path_;
  std::shared_ptr<const Mapping> mapping_;
  std::string_view bytes_;  // the whole file, in mapping_
  std::size_t data_start_ = 0;
  Metadata metadata_;
  std::map<std::string, Entry> entries_;
  bool checksummed_ = false;
};

// XXH3-64 of the bytes as 16 lowercase hex digits: every checksum braid
// writes into a checkpoint (here, and layout.h's state files).
std::string xxh3_hex(const void* data, std::size_t bytes);

// The __metadata__ key of a tensor's checksum: "xxh3:<name>".
std::string checksum_key(const std::string& tensor_name);

// "[3, 128]"
std::string shape_string(const std::vector<std::int64_t>& shape);

}  // namespace braid::trainer
