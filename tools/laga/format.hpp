// Small text helpers for the CLI's tables.
#pragma once

#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "laga/errors.hpp"

namespace laga::cli {

inline std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024.0 && u < 4) {
    bytes /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", bytes, units[u]);
  return buf;
}

inline std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// A count from the command line: "16384", or "16k" (x1024). Throws InvalidArgument naming `what`.
inline std::int64_t parse_count(const std::string& what, const std::string& text) {
  std::size_t pos = 0;
  long long v = 0;
  try {
    v = std::stoll(text, &pos);
  } catch (const std::out_of_range&) {
    LAGA_REQUIRE(false, what, " = '", text, "': does not fit in 64 bits (limit 2^63 - 1)");
  } catch (...) {
    LAGA_REQUIRE(false, what, " = '", text, "': expected a positive integer (a 'k' suffix multiplies by 1024)");
  }
  std::string rest = text.substr(pos);
  if (rest == "k" || rest == "K") {
    LAGA_REQUIRE(!__builtin_mul_overflow(v, 1024LL, &v), what, " = '", text,
                 "': does not fit in 64 bits (limit 2^63 - 1)");
    rest.clear();
  }
  LAGA_REQUIRE(rest.empty() && v > 0, what, " = '", text, "': expected a positive integer (a 'k' suffix multiplies by 1024)");
  return v;
}

// A table printed with columns padded to their widest cell; the first `left` columns are left-aligned.
class Table {
 public:
  explicit Table(std::vector<std::string> header, std::size_t left = 1) : rows_{std::move(header)}, left_(left) {}
  void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  void print(std::FILE* out = stdout) const {
    std::vector<std::size_t> w(rows_[0].size(), 0);
    for (const auto& r : rows_)
      for (std::size_t i = 0; i < r.size() && i < w.size(); ++i) w[i] = std::max(w[i], r[i].size());
    for (std::size_t k = 0; k < rows_.size(); ++k) {
      std::string line;
      for (std::size_t i = 0; i < rows_[k].size() && i < w.size(); ++i) {
        const std::string& c = rows_[k][i];
        const std::string pad(w[i] - c.size(), ' ');
        line += (i ? "  " : "") + (i < left_ ? c + pad : pad + c);
      }
      std::fprintf(out, "%s\n", line.c_str());
      if (k == 0) {
        std::size_t total = 0;
        for (auto x : w) total += x + 2;
        std::fprintf(out, "%s\n", std::string(total - 2, '-').c_str());
      }
    }
  }

 private:
  std::vector<std::vector<std::string>> rows_;
  std::size_t left_;
};

}  // namespace laga::cli
