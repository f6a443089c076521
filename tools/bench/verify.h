// Verifiable inputs and expected results for collectives, shared by
// braid-bench's check (-c 1) and the test suite. Inputs are small integers so
// that every result is exact in every dtype whatever the order of reduction:
// sums of every rank stay at most 160 up to 160 ranks (bf16 holds every
// integer to 256; the integer types wrap alike in any order), and products use a
// single factor 2 from each of at most 6 ranks (verify.cc says how).
#pragma once

#include <cstddef>
#include <vector>

#include "kernels/dtype.h"

namespace braid::verify {

double input_value(int rank, std::size_t index, int size, ReduceOp op);
// The inputs repeat with this period in the index (a prime: 8191).
std::size_t input_period();
// buf[i] = v converted to dtype (f16/bf16 rounded to nearest even).
void store_value(void* buf, std::size_t i, DataType dtype, double v);
// Fills count elements of rank's input, element j holding input_value(rank, first + j).
void fill_input(void* buf, std::size_t count, std::size_t first, int rank, int size, DataType dtype, ReduceOp op);
// The reduction over all ranks of element `index`, as `dtype` bytes.
std::vector<std::byte> expected_reduction(std::size_t index, int size, DataType dtype, ReduceOp op);
// The input element `index` of `rank`, as `dtype` bytes.
std::vector<std::byte> expected_input(int rank, std::size_t index, int size, DataType dtype, ReduceOp op);

// The same values, tabulated: inputs repeat with input_period() in the
// index, so checking a 256 MiB result costs a table lookup per element.
class ExpectedTable {
 public:
  ExpectedTable(int size, DataType dtype, ReduceOp op);
  const std::byte* reduction(std::size_t index) const { return &reduced_[(index % period_) * es_]; }
  const std::byte* input(int rank, std::size_t index) const {
    return &inputs_[(static_cast<std::size_t>(rank) * period_ + index % period_) * es_];
  }
  std::size_t element_bytes() const { return es_; }
  // fill_input(buf, count, 0, rank, ...)'s bytes, a period at a time.
  void fill_input(void* buf, std::size_t count, int rank) const;

 private:
  std::size_t period_, es_;
  std::vector<std::byte> reduced_, inputs_;
};

}  // namespace braid::verify
