// Median, quartiles and range of repeated measurements (include/laga/bench.hpp).
#include <algorithm>
#include <cmath>
#include <numeric>

#include "laga/bench.hpp"
#include "laga/errors.hpp"

namespace laga {
namespace {

void check_samples(const std::vector<double>& samples) {
  LAGA_REQUIRE(!samples.empty(), "statistics of no samples: at least one is needed");
  for (std::size_t i = 0; i < samples.size(); ++i)
    LAGA_REQUIRE(std::isfinite(samples[i]), "sample ", i, " = ", samples[i], ": must be finite");
}

// Type 7 on samples already sorted.
double sorted_quantile(const std::vector<double>& x, double q) {
  const double h = double(x.size() - 1) * q;
  const std::size_t lo = static_cast<std::size_t>(std::floor(h));
  if (lo + 1 >= x.size()) return x.back();
  return x[lo] + (h - double(lo)) * (x[lo + 1] - x[lo]);
}

}  // namespace

double quantile(std::vector<double> samples, double q) {
  check_samples(samples);
  LAGA_REQUIRE(q >= 0.0 && q <= 1.0, "quantile q = ", q, ": must be in [0, 1]");
  std::sort(samples.begin(), samples.end());
  return sorted_quantile(samples, q);
}

double median(const std::vector<double>& samples) { return quantile(samples, 0.5); }

Summary summarize(const std::vector<double>& samples) {
  check_samples(samples);
  std::vector<double> x = samples;
  std::sort(x.begin(), x.end());
  Summary s;
  s.n = x.size();
  s.min = x.front();
  s.max = x.back();
  s.median = sorted_quantile(x, 0.5);
  s.q1 = sorted_quantile(x, 0.25);
  s.q3 = sorted_quantile(x, 0.75);
  s.mean = std::accumulate(x.begin(), x.end(), 0.0) / double(x.size());
  return s;
}

}  // namespace laga
