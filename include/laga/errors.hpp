// One header of checks: every failure says what failed, where, and with which value.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace laga {

// Thrown for invalid input (bad configuration, shapes, options). The CLI turns it into exit code 2.
class InvalidArgument : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// Thrown when a library call (BLAS, MPI, CUDA, NCCL) or an internal invariant fails.
class RuntimeError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

}  // namespace laga

// Validation of user input: LAGA_REQUIRE(cond, "field", value, "rule text").
#define LAGA_REQUIRE(cond, ...)                                                 \
  do {                                                                          \
    if (!(cond)) throw ::laga::InvalidArgument(::laga::detail::concat(__VA_ARGS__)); \
  } while (0)

// Internal invariants: names the failed condition and the source location.
#define LAGA_CHECK(cond, ...)                                                          \
  do {                                                                                 \
    if (!(cond))                                                                       \
      throw ::laga::RuntimeError(::laga::detail::concat(__FILE__, ":", __LINE__, ": check '", \
                                                        #cond, "' failed: ", ##__VA_ARGS__)); \
  } while (0)
