// Minimal NumPy .npy reader/writer: little-endian float32 ('<f4') and float64 ('<f8'), C order.
// Used for reference tensors exchanged with Python. Writes format 1.0; reads 1.0, 2.0 and 3.0.
// Every failure throws InvalidArgument naming the path and the problem.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "laga/tensor.hpp"  // DType

namespace laga {

struct NpyArray {
  std::string descr;                // "<f4" or "<f8"
  std::vector<std::int64_t> shape;  // empty for a 0-d array (one element)
  std::vector<char> data;           // raw little-endian bytes, C order

  DType dtype() const;              // f32 for "<f4", f64 for "<f8"
  std::int64_t numel() const;       // product of shape (1 for 0-d)
  std::vector<double> to_doubles() const;
  std::vector<float> to_floats() const;
};

// Writes numel(shape) elements of `dtype` (f32 or f64; bf16 is refused) from `data` in C order.
void write_npy(const std::string& path, const std::vector<std::int64_t>& shape, DType dtype, const void* data);
// Convenience overloads; values.size() must equal the product of shape.
void write_npy(const std::string& path, const std::vector<std::int64_t>& shape, const std::vector<float>& values);
void write_npy(const std::string& path, const std::vector<std::int64_t>& shape, const std::vector<double>& values);

NpyArray read_npy(const std::string& path);
// Reads an f32 or f64 array converted to double; `shape` (if given) receives its shape.
std::vector<double> read_npy_doubles(const std::string& path, std::vector<std::int64_t>* shape = nullptr);

}  // namespace laga
