// NumPy .npy I/O (format spec: numpy/lib/format.py). Only what reference tensors need: '<f4'/'<f8', C order.
#include "laga/npy.hpp"

#include <bit>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "laga/errors.hpp"

namespace laga {

// The data bytes are copied as they are, so the host must be little-endian like the files we write.
static_assert(std::endian::native == std::endian::little, "npy.cpp assumes a little-endian host");

namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr std::size_t kMagicLen = 6;

// Local rather than dtype_size(): keeps this file free of tensor.cpp so tests can link it alone.
std::size_t item_size(const std::string& descr) { return descr == "<f4" ? 4 : 8; }

const char* descr_of(DType dtype, const std::string& path) {
  switch (dtype) {
    case DType::F32: return "<f4";
    case DType::F64: return "<f8";
    default: break;
  }
  throw InvalidArgument(detail::concat("npy file \"", path,
                                       "\": only f32 and f64 can be written (convert bf16 to f32 first)"));
}

// numel with overflow checks; every dimension must be >= 0.
std::int64_t checked_numel(const std::vector<std::int64_t>& shape, const std::string& path) {
  std::int64_t n = 1;
  for (std::int64_t d : shape) {
    LAGA_REQUIRE(d >= 0, "npy file \"", path, "\": negative dimension ", d, " in shape");
    LAGA_REQUIRE(d == 0 || n <= std::numeric_limits<std::int64_t>::max() / 16 / d, "npy file \"", path,
                 "\": shape is too large");
    n *= d;
  }
  return n;
}

std::string shape_tuple(const std::vector<std::int64_t>& shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  if (shape.size() == 1) s += ",";  // Python's one-element tuple
  return s + ")";
}

// A parser for the header: a Python dict literal with string keys and string, bool or int-tuple values.
class HeaderParser {
 public:
  HeaderParser(const std::string& text, const std::string& path) : s_(text), path_(path) {}

  void parse(std::string* descr, bool* fortran_order, std::vector<std::int64_t>* shape) {
    bool have_descr = false, have_order = false, have_shape = false;
    expect('{');
    while (true) {
      skip_ws();
      if (peek() == '}') { ++i_; break; }
      const std::string key = parse_string();
      expect(':');
      if (key == "descr") {
        *descr = parse_string();
        have_descr = true;
      } else if (key == "fortran_order") {
        *fortran_order = parse_bool();
        have_order = true;
      } else if (key == "shape") {
        *shape = parse_tuple();
        have_shape = true;
      } else {
        fail("unexpected key '" + key + "' in header");
      }
      skip_ws();
      if (peek() == ',') { ++i_; continue; }
      expect('}');
      break;
    }
    if (!have_descr) fail("header has no 'descr'");
    if (!have_order) fail("header has no 'fortran_order'");
    if (!have_shape) fail("header has no 'shape'");
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw InvalidArgument(detail::concat("npy file \"", path_, "\": ", what, " (header: ", trimmed(), ")"));
  }
  std::string trimmed() const {
    std::string t = s_;
    while (!t.empty() && std::isspace(static_cast<unsigned char>(t.back()))) t.pop_back();
    return t;
  }
  void skip_ws() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }
  char peek() const { return i_ < s_.size() ? s_[i_] : '\0'; }
  void expect(char c) {
    skip_ws();
    if (peek() != c) fail(std::string("malformed header: expected '") + c + "' at offset " + std::to_string(i_));
    ++i_;
  }
  std::string parse_string() {
    skip_ws();
    const char q = peek();
    if (q != '\'' && q != '"') fail("malformed header: expected a quoted string at offset " + std::to_string(i_));
    const std::size_t end = s_.find(q, i_ + 1);
    if (end == std::string::npos) fail("malformed header: unterminated string");
    std::string out = s_.substr(i_ + 1, end - i_ - 1);
    i_ = end + 1;
    return out;
  }
  bool parse_bool() {
    skip_ws();
    if (s_.compare(i_, 4, "True") == 0) { i_ += 4; return true; }
    if (s_.compare(i_, 5, "False") == 0) { i_ += 5; return false; }
    fail("malformed header: expected True or False for 'fortran_order'");
  }
  std::vector<std::int64_t> parse_tuple() {
    std::vector<std::int64_t> out;
    expect('(');
    while (true) {
      skip_ws();
      if (peek() == ')') { ++i_; break; }
      if (!std::isdigit(static_cast<unsigned char>(peek()))) fail("malformed header: bad 'shape' entry");
      std::int64_t v = 0;
      while (std::isdigit(static_cast<unsigned char>(peek()))) {
        if (v > (std::numeric_limits<std::int64_t>::max() - 9) / 10) fail("'shape' entry is too large");
        v = v * 10 + (s_[i_++] - '0');
      }
      if (peek() == 'L') ++i_;  // Python 2 long suffix
      out.push_back(v);
      skip_ws();
      if (peek() == ',') { ++i_; continue; }
      expect(')');
      break;
    }
    return out;
  }

  const std::string& s_;
  const std::string& path_;
  std::size_t i_ = 0;
};

}  // namespace

DType NpyArray::dtype() const {
  if (descr == "<f4") return DType::F32;
  if (descr == "<f8") return DType::F64;
  throw InvalidArgument(detail::concat("npy array: unsupported descr '", descr, "'"));
}

std::int64_t NpyArray::numel() const {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

std::vector<double> NpyArray::to_doubles() const {
  const std::size_t n = static_cast<std::size_t>(numel());
  std::vector<double> out(n);
  if (dtype() == DType::F64) {
    std::memcpy(out.data(), data.data(), n * sizeof(double));
  } else {
    for (std::size_t i = 0; i < n; ++i) {
      float f;
      std::memcpy(&f, data.data() + i * sizeof(float), sizeof(float));
      out[i] = f;
    }
  }
  return out;
}

std::vector<float> NpyArray::to_floats() const {
  const std::size_t n = static_cast<std::size_t>(numel());
  std::vector<float> out(n);
  if (dtype() == DType::F32) {
    std::memcpy(out.data(), data.data(), n * sizeof(float));
  } else {
    for (std::size_t i = 0; i < n; ++i) {
      double d;
      std::memcpy(&d, data.data() + i * sizeof(double), sizeof(double));
      out[i] = static_cast<float>(d);
    }
  }
  return out;
}

void write_npy(const std::string& path, const std::vector<std::int64_t>& shape, DType dtype, const void* data) {
  const std::string descr = descr_of(dtype, path);
  const std::int64_t n = checked_numel(shape, path);
  LAGA_REQUIRE(data != nullptr || n == 0, "npy file \"", path, "\": null data for ", n, " elements");

  std::string header =
      "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape_tuple(shape) + ", }";
  // Pad with spaces and end in '\n' so that the data starts on a 64-byte boundary (as numpy does).
  const std::size_t preamble = kMagicLen + 2 + 2;
  std::size_t total = preamble + header.size() + 1;
  total = (total + 63) / 64 * 64;
  header.append(total - preamble - header.size() - 1, ' ');
  header.push_back('\n');
  LAGA_REQUIRE(header.size() <= 0xFFFF, "npy file \"", path, "\": header too long for format 1.0");

  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  LAGA_REQUIRE(out.good(), "npy file \"", path, "\": cannot open for writing");
  const std::uint16_t hlen = static_cast<std::uint16_t>(header.size());
  const char version[2] = {1, 0};
  const char len_le[2] = {static_cast<char>(hlen & 0xFF), static_cast<char>(hlen >> 8)};
  out.write(kMagic, kMagicLen);
  out.write(version, 2);
  out.write(len_le, 2);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(n * item_size(descr)));
  out.flush();
LAGA_REQUIRE(out.good(), "npy file \"", path, "\": write failed");
}

void write_npy(const std::string& path, const std::vector<std::int64_t>& shape, const std::vector<float>& values) {
  const std::int64_t n = checked_numel(shape, path);
  LAGA_REQUIRE(n == static_cast<std::int64_t>(values.size()), "npy file \"", path, "\": shape ",
               shape_tuple(shape), " holds ", n, " elements but ", values.size(), " were given");
  write_npy(path, shape, DType::F32, values.data());
}

void write_npy(const std::string& path, const std::vector<std::int64_t>& shape, const std::vector<double>& values) {
  const std::int64_t n = checked_numel(shape, path);
  LAGA_REQUIRE(n == static_cast<std::int64_t>(values.size()), "npy file \"", path, "\": shape ",
               shape_tuple(shape), " holds ", n, " elements but ", values.size(), " were given");
  write_npy(path, shape, DType::F64, values.data());
}

NpyArray read_npy(const std::string& path) {
  // Opening a FIFO or a device would block or never end: only regular files are read.
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  LAGA_REQUIRE(ec || st.type() == std::filesystem::file_type::not_found ||
                   st.type() == std::filesystem::file_type::regular,
               "npy file \"", path, "\": not a regular file (a FIFO, device or directory cannot be read)");
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  LAGA_REQUIRE(in.good(), "npy file \"", path, "\": cannot open for reading");
  const std::streamoff file_size = in.tellg();
  in.seekg(0);

  char pre[kMagicLen + 2];
  in.read(pre, sizeof(pre));
  LAGA_REQUIRE(in.gcount() == static_cast<std::streamsize>(sizeof(pre)) && std::memcmp(pre, kMagic, kMagicLen) == 0,
               "npy file \"", path, "\": not a .npy file (bad magic)");
  const int major = static_cast<unsigned char>(pre[kMagicLen]);
  LAGA_REQUIRE(major >= 1 && major <= 3, "npy file \"", path, "\": unsupported format version ", major, ".",
               static_cast<int>(static_cast<unsigned char>(pre[kMagicLen + 1])));
  // Version 1.0 has a 2-byte header length, 2.0 and 3.0 a 4-byte one.
  const int len_bytes = major == 1 ? 2 : 4;
  unsigned char len_buf[4] = {0, 0, 0, 0};
  in.read(reinterpret_cast<char*>(len_buf), len_bytes);
  LAGA_REQUIRE(in.gcount() == len_bytes, "npy file \"", path, "\": truncated header");
  std::uint64_t header_len = 0;
  for (int b = len_bytes - 1; b >= 0; --b) header_len = (header_len << 8) | len_buf[b];
  const std::uint64_t data_offset = kMagicLen + 2 + len_bytes + header_len;
  LAGA_REQUIRE(data_offset <= static_cast<std::uint64_t>(file_size), "npy file \"", path,
               "\": truncated header (", header_len, " bytes announced, file is ", file_size, " bytes)");
  std::string header(header_len, '\0');
  in.read(header.data(), static_cast<std::streamsize>(header_len));
  LAGA_REQUIRE(in.gcount() == static_cast<std::streamsize>(header_len), "npy file \"", path, "\": truncated header");

  NpyArray a;
  bool fortran_order = false;
  HeaderParser(header, path).parse(&a.descr, &fortran_order, &a.shape);
  LAGA_REQUIRE(!fortran_order, "npy file \"", path,
               "\": fortran_order is True; only C-order arrays are supported (save with np.ascontiguousarray)");
  LAGA_REQUIRE(a.descr == "<f4" || a.descr == "<f8", "npy file \"", path, "\": unsupported descr '", a.descr,
               "' (only '<f4' and '<f8')");

  const std::int64_t n = checked_numel(a.shape, path);
  const std::uint64_t want = static_cast<std::uint64_t>(n) * item_size(a.descr);
  const std::uint64_t have = static_cast<std::uint64_t>(file_size) - data_offset;
  LAGA_REQUIRE(have >= want, "npy file \"", path, "\": truncated data: shape ", shape_tuple(a.shape), " of ",
               a.descr, " needs ", want, " bytes, found ", have);
  LAGA_REQUIRE(have == want, "npy file \"", path, "\": ", have - want, " unexpected bytes after the data");
  a.data.resize(want);
  in.read(a.data.data(), static_cast<std::streamsize>(want));
  LAGA_REQUIRE(in.gcount() == static_cast<std::streamsize>(want), "npy file \"", path, "\": read failed");
  return a;
}

std::vector<double> read_npy_doubles(const std::string& path, std::vector<std::int64_t>* shape) {
  NpyArray a = read_npy(path);
  if (shape) *shape = a.shape;
  return a.to_doubles();
}

}  // namespace laga
