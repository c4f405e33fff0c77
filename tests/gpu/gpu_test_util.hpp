// Shared helpers of the GPU suites: the skip guard, host/device mirrors of strided buffers, and the checks
// every op test applies to an output (every element of its view written, nothing outside it touched,
// relative Frobenius error against the CPU float64 result within the dtype's tolerance).
//
// Method: inputs are random (uniform, never zeros), drawn fresh for each check, uploaded in the test's dtype
// and read back, so the CPU float64 reference sees exactly the values the GPU sees. Outputs are poisoned
// with NaN before each run. Each measured error is printed on a line starting with "GPUCHECK" (collected by
// scripts/gpu.sh check into its table).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/block_configs.hpp"
#include "laga/backend.hpp"
#include "laga/config.hpp"
#include "laga/cuda.hpp"
#include "laga/problem.hpp"
#include "laga/tensor.hpp"

// First statement of every GPU test.
#define LAGA_REQUIRE_GPU()                                                                        \
  do {                                                                                            \
    if (!::laga::cuda_available()) GTEST_SKIP() << "no usable CUDA device (or built without CUDA)"; \
  } while (0)

namespace laga::gpu_test {

using i64 = std::int64_t;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

inline const char* dtype_tag(DType t) { return t == DType::BF16 ? "bf16" : t == DType::F32 ? "f32" : "f64"; }

// Relative Frobenius error allowed for one op against float64: bf16 storage (fp32 accumulation) and f32.
inline double op_tolerance(DType t) { return t == DType::BF16 ? 1e-2 : 1e-5; }

// A device tensor's bytes, for bitwise comparisons.
inline std::vector<std::uint8_t> raw_bytes(Backend& be, const Tensor& t) {
  std::vector<std::uint8_t> out(t.bytes());
  be.copy_to_host(out.data(), t);
  return out;
}

using test::mla_dims;  // DeepSeek-V3's head dims on a small model (tests/common/block_configs.hpp)

// One random generator per test, seeded from the test's name: reruns draw the same data, tests differ.
inline std::mt19937_64 rng_for_test() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string name = std::string(info->test_suite_name()) + "." + info->name();
  return std::mt19937_64(std::hash<std::string>{}(name));
}

// The two backends of a test: the GPU under test and the CPU float64 reference.
struct Backends {
  std::unique_ptr<Backend> gpu = make_cuda_backend(0);
  std::unique_ptr<Backend> cpu = make_cpu_backend();
};

// A buffer of n elements on the GPU (in the test's dtype) and its float64 twin on the host, which the CPU
// backend uses directly as its buffer. `host` holds the GPU's values (rounded to the dtype) after upload().
struct Mirror {
  Tensor dev;
  std::vector<double> host;

  Mirror() = default;
  Mirror(Backend& gpu, DType dtype, i64 n, const std::string& name)
      : dev(gpu.allocator(), dtype, {n}, name, MemoryKind::External), host(static_cast<std::size_t>(n), kNaN) {}

  // host := values; the GPU copy gets them rounded to its dtype, and host is read back to match.
  void upload(Backend& gpu, const std::vector<double>& values) {
    from_host(gpu, dev, values);
    host = to_host(gpu, dev);
  }
  // Both sides NaN (the GPU through the backend's fill).
  void poison(Backend& gpu) {
    gpu.fill(dev, kNaN);
    std::fill(host.begin(), host.end(), kNaN);
  }
  std::vector<double> download(Backend& gpu) const { return to_host(gpu, dev); }
  double* cpu() { return host.data(); }
  void* gpu() const { return dev.data(); }
};

// Uniform in [lo, hi) (never exactly zero in practice), n values.
inline std::vector<double> random_values(std::mt19937_64& rng, i64 n, double lo = -1.0, double hi = 1.0) {
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<double> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = u(rng);
  return v;
}

inline Mirror random_mirror(Backend& gpu, DType dtype, i64 n, std::mt19937_64& rng, const std::string& name,
                            double lo = -1.0, double hi = 1.0) {
  Mirror m(gpu, dtype, n, name);
  m.upload(gpu, random_values(rng, n, lo, hi));
  return m;
}

inline Mirror poisoned_mirror(Backend& gpu, DType dtype, i64 n, const std::string& name) {
  Mirror m(gpu, dtype, n, name);
  m.poison(gpu);
  return m;
}

// ||a - b|| / ||b|| over the elements with mask[i] set (long double sums); NaN if any compared value is NaN.
inline double rel_error(const std::vector<double>& got, const std::vector<double>& ref, const std::vector<char>& mask) {
  long double num = 0, den = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    if (!mask[i]) continue;
    if (std::isnan(got[i]) || std::isnan(ref[i])) return kNaN;
    const long double d = (long double)got[i] - (long double)ref[i];
    num += d * d;
    den += (long double)ref[i] * (long double)ref[i];
  }
  if (den == 0) return num == 0 ? 0.0 : INFINITY;
  return double(std::sqrt(num / den));
}

inline void report(const std::string& what, const std::string& tensor, DType dtype, double err, double tol) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::printf("GPUCHECK %s.%s %s %s rel_err=%.3e tol=%.1e\n", info->test_suite_name(), info->name(), tensor.c_str(),
              dtype_tag(dtype), err, tol);
  (void)what;
}

// The checks of one output: within the view (mask), every element written (finite) and within `tol` of the
// reference; outside the view, when the output was poisoned, still NaN (not written).
inline void expect_output(const std::string& name, DType dtype, const std::vector<double>& got,
                          const std::vector<double>& ref, const std::vector<char>& mask, double tol,
                          bool poisoned_outside = true) {
  ASSERT_EQ(got.size(), ref.size()) << name;
  ASSERT_EQ(mask.size(), ref.size()) << name;
  i64 unwritten = 0, written_outside = 0, in_view = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (mask[i]) {
      ++in_view;
      unwritten += !std::isfinite(got[i]);
    } else if (poisoned_outside) {
      written_outside += !std::isnan(got[i]);
    }
  }
  EXPECT_GT(in_view, 0) << name << ": empty view";
  EXPECT_EQ(unwritten, 0) << name << ": elements of the view not written (or not finite)";
  EXPECT_EQ(written_outside, 0) << name << ": elements outside the view written";
  const double err = rel_error(got, ref, mask);
  report(name, name, dtype, err, tol);
  EXPECT_LE(err, tol) << name << " (" << dtype_tag(dtype) << "): relative error against float64";
}

}  // namespace laga::gpu_test
