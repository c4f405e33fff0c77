// Overflow-checked size arithmetic: products and sums of element counts and bytes that must stay inside
// int64. A size that leaves it is refused as invalid input (InvalidArgument), naming what was computed.
#pragma once

#include <cstdint>
#include <limits>
#include <string>

#include "laga/errors.hpp"

namespace laga {

inline constexpr std::int64_t kMaxSize = std::numeric_limits<std::int64_t>::max();

// a * b, or InvalidArgument "<what> = a x b: does not fit in 64 bits (limit 2^63 - 1)".
inline std::int64_t checked_mul(std::int64_t a, std::int64_t b, const std::string& what) {
  std::int64_t r = 0;
  LAGA_REQUIRE(!__builtin_mul_overflow(a, b, &r), what, " = ", a, " x ", b,
               ": does not fit in 64 bits (limit 2^63 - 1 = ", kMaxSize, ")");
  return r;
}

inline std::int64_t checked_add(std::int64_t a, std::int64_t b, const std::string& what) {
  std::int64_t r = 0;
  LAGA_REQUIRE(!__builtin_add_overflow(a, b, &r), what, " = ", a, " + ", b,
               ": does not fit in 64 bits (limit 2^63 - 1 = ", kMaxSize, ")");
  return r;
}

// The product of every factor, checked after each step.
inline std::int64_t checked_product(std::initializer_list<std::int64_t> factors, const std::string& what) {
  std::int64_t r = 1;
  for (std::int64_t f : factors) r = checked_mul(r, f, what);
  return r;
}

}  // namespace laga
