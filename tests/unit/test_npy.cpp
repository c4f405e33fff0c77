// NumPy .npy reader/writer: round trips, files with hand-written headers, and the error messages.
#include <gtest/gtest.h>

#include <cctype>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <unistd.h>
#include <vector>

#include "laga/errors.hpp"
#include "laga/npy.hpp"

namespace laga {
namespace {

namespace fs = std::filesystem;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected InvalidArgument, got another exception: " << e.what();
    return e.what();
  }
  ADD_FAILURE() << "expected InvalidArgument, nothing was thrown";
  return "";
}

class NpyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string leaf = std::string("laga_npy_") + std::to_string(::getpid()) + "_" + info->test_suite_name() +
                       "_" + info->name();
    for (char& ch : leaf)
      if (ch == '/') ch = '_';
    dir_ = fs::temp_directory_path() / leaf;
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  static std::string slurp(const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  // A .npy file with the given header dict text (padded to 64 bytes as numpy does) followed by `data`.
  std::string hand_written(const std::string& name, const std::string& dict, const std::string& data,
                           int major = 1) {
    const std::size_t preamble = 6 + 2 + (major == 1 ? 2 : 4);
    std::string header = dict;
    while ((preamble + header.size() + 1) % 64 != 0) header.push_back(' ');
    header.push_back('\n');
    std::string bytes("\x93NUMPY", 6);
    bytes.push_back(static_cast<char>(major));
    bytes.push_back(0);
    const std::uint32_t len = static_cast<std::uint32_t>(header.size());
    for (int b = 0; b < (major == 1 ? 2 : 4); ++b) bytes.push_back(static_cast<char>((len >> (8 * b)) & 0xFF));
    bytes += header + data;
    const std::string p = path(name);
    std::ofstream(p, std::ios::binary) << bytes;
    return p;
  }

  template <typename T>
  static std::string raw(const std::vector<T>& v) {
    return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
  }

  fs::path dir_;
};

// ---------------------------------------------------------------------------------------------
// Round trips

class NpyRoundTrip : public NpyTest, public ::testing::WithParamInterface<DType> {};

TEST_P(NpyRoundTrip, ThreeDimensional) {
  const DType dt = GetParam();
  const std::vector<std::int64_t> shape = {2, 3, 4};
  std::vector<double> d(24);
  std::vector<float> f(24);
  for (int i = 0; i < 24; ++i) {
    d[i] = 0.1 * i - 1.0 / (i + 1);
    f[i] = static_cast<float>(d[i]);
  }
  const void* src = dt == DType::F32 ? static_cast<const void*>(f.data()) : static_cast<const void*>(d.data());
  const std::size_t item = dt == DType::F32 ? 4 : 8;
  const std::string p = path("a.npy");
  write_npy(p, shape, dt, src);

  const NpyArray a = read_npy(p);
  EXPECT_EQ(a.descr, dt == DType::F32 ? "<f4" : "<f8");
  EXPECT_EQ(a.dtype(), dt);
  EXPECT_EQ(a.shape, shape);
  EXPECT_EQ(a.numel(), 24);
  ASSERT_EQ(a.data.size(), 24 * item);
  EXPECT_EQ(std::memcmp(a.data.data(), src, a.data.size()), 0);

  // The header is numpy's: the same dict text, padded so that the data starts at a multiple of 64.
  const std::string bytes = slurp(p);
  EXPECT_EQ(bytes.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
  const std::size_t hlen = static_cast<unsigned char>(bytes[8]) | (static_cast<unsigned char>(bytes[9]) << 8);
  EXPECT_EQ((10 + hlen) % 64, 0u);
  EXPECT_EQ(bytes.size(), 10 + hlen + 24 * item);
  const std::string header = bytes.substr(10, hlen);
  EXPECT_EQ(header.rfind(std::string("{'descr': '") + (dt == DType::F32 ? "<f4" : "<f8") +
                             "', 'fortran_order': False, 'shape': (2, 3, 4), }",
                         0),
            0u)
      << header;
  EXPECT_EQ(header.back(), '\n');

  // Conversions see the same values.
  const std::vector<double> back = read_npy_doubles(p);
  ASSERT_EQ(back.size(), 24u);
  for (int i = 0; i < 24; ++i) EXPECT_EQ(back[i], dt == DType::F32 ? static_cast<double>(f[i]) : d[i]) << i;
  const std::vector<float> backf = a.to_floats();
  for (int i = 0; i < 24; ++i) EXPECT_EQ(backf[i], f[i]) << i;
}

INSTANTIATE_TEST_SUITE_P(Dtypes, NpyRoundTrip, ::testing::Values(DType::F32, DType::F64),
                         [](const auto& info) { return info.param == DType::F32 ? "f32" : "f64"; });

TEST_F(NpyTest, OneDimensionalAndScalarShapes) {
  const std::string p1 = path("v.npy");
  write_npy(p1, {5}, std::vector<double>{1, 2, 3, 4, 5});
  EXPECT_NE(slurp(p1).find("'shape': (5,), }"), std::string::npos);  // Python's one-element tuple
  std::vector<std::int64_t> shape;
  EXPECT_EQ(read_npy_doubles(p1, &shape), (std::vector<double>{1, 2, 3, 4, 5}));
  EXPECT_EQ(shape, (std::vector<std::int64_t>{5}));

  const std::string p0 = path("s.npy");
  write_npy(p0, {}, std::vector<float>{2.5f});
  EXPECT_NE(slurp(p0).find("'shape': (), }"), std::string::npos);
  const NpyArray s = read_npy(p0);
  EXPECT_TRUE(s.shape.empty());
  EXPECT_EQ(s.numel(), 1);
  EXPECT_EQ(s.to_doubles(), (std::vector<double>{2.5}));
}

TEST_F(NpyTest, EmptyArray) {
  const std::string p = path("e.npy");
  write_npy(p, {3, 0}, DType::F32, nullptr);
  const NpyArray a = read_npy(p);
  EXPECT_EQ(a.shape, (std::vector<std::int64_t>{3, 0}));
  EXPECT_TRUE(a.data.empty());
}

// ---------------------------------------------------------------------------------------------
// Files written by hand, as numpy would write them

TEST_F(NpyTest, ReadsAHandWrittenHeader) {
  const std::vector<double> v = {1.5, -2.0, 3.25, 4.0, 0.0, -0.5};
  const std::string p =
      hand_written("h.npy", "{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), }", raw(v));
  const NpyArray a = read_npy(p);
  EXPECT_EQ(a.descr, "<f8");
  EXPECT_EQ(a.shape, (std::vector<std::int64_t>{2, 3}));
  EXPECT_EQ(a.to_doubles(), v);
}

TEST_F(NpyTest, ReadsOtherKeyOrderNoTrailingCommaAndVersion2) {
  const std::vector<float> v = {1.0f, 2.0f, 3.0f};
  const std::string p1 = hand_written("o.npy", "{'shape': (3,), 'fortran_order': False, 'descr': '<f4'}", raw(v));
  EXPECT_EQ(read_npy(p1).to_floats(), v);
  const std::string p2 =
      hand_written("v2.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 3), }", raw(v), 2);
  const NpyArray a = read_npy(p2);
  EXPECT_EQ(a.shape, (std::vector<std::int64_t>{1, 3}));
  EXPECT_EQ(a.to_floats(), v);
}

// ---------------------------------------------------------------------------------------------
// Errors name the path and the problem

TEST_F(NpyTest, MissingFile) {
  const std::string p = path("absent.npy");
  const std::string msg = error_of([&] { read_npy(p); });
  EXPECT_NE(msg.find(p), std::string::npos) << msg;
  EXPECT_NE(msg.find("cannot open"), std::string::npos) << msg;
}

TEST_F(NpyTest, FortranOrderIsRejected) {
  const std::string p = hand_written("f.npy", "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }",
                                     raw(std::vector<float>(4, 1.0f)));
  const std::string msg = error_of([&] { read_npy(p); });
  EXPECT_NE(msg.find(p), std::string::npos) << msg;
  EXPECT_NE(msg.find("fortran_order"), std::string::npos) << msg;
}

class NpyBadDescr : public NpyTest, public ::testing::WithParamInterface<std::string> {};

TEST_P(NpyBadDescr, IsRejectedByName) {
  const std::string p = hand_written("d.npy", "{'descr': '" + GetParam() + "', 'fortran_order': False, 'shape': (2,), }",
                                     std::string(16, '\0'));
  const std::string msg = error_of([&] { read_npy(p); });
  EXPECT_NE(msg.find(p), std::string::npos) << msg;
  EXPECT_NE(msg.find("unsupported descr '" + GetParam() + "'"), std::string::npos) << msg;
}

INSTANTIATE_TEST_SUITE_P(Descrs, NpyBadDescr, ::testing::Values(">f4", ">f8", "<i8", "<u2", "<f2", "|u1"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string s;
                           for (char ch : info.param) s += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
                           return s + "_" + std::to_string(info.index);
                         });

TEST_F(NpyTest, TruncatedData) {
  const std::string p = hand_written("t.npy", "{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), }",
                                     raw(std::vector<double>(5, 1.0)));
  const std::string msg = error_of([&] { read_npy(p); });
  EXPECT_NE(msg.find(p), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated data"), std::string::npos) << msg;
  EXPECT_NE(msg.find("needs 48 bytes, found 40"), std::string::npos) << msg;
}

TEST_F(NpyTest, TrailingBytes) {
  const std::string p = hand_written("x.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }",
                                     raw(std::vector<float>(3, 1.0f)));
  const std::string msg = error_of([&] { read_npy(p); });
  EXPECT_NE(msg.find("4 unexpected bytes after the data"), std::string::npos) << msg;
}

TEST_F(NpyTest, TruncatedHeader) {
  std::string p = hand_written("th.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", "");
  fs::resize_file(p, 40);
  const std::string msg = error_of([&] { read_npy(p); });
  EXPECT_NE(msg.find(p), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated header"), std::string::npos) << msg;
}

TEST_F(NpyTest, NotAnNpyFile) {
  const std::string p = path("text.npy");
  std::ofstream(p) << "hello, this is not numpy";
  const std::string msg = error_of([&] { read_npy(p); });
  EXPECT_NE(msg.find(p), std::string::npos) << msg;
  EXPECT_NE(msg.find("bad magic"), std::string::npos) << msg;
}

TEST_F(NpyTest, MalformedHeader) {
  const std::string p = hand_written("m.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': [2], }",
                                     raw(std::vector<float>(2, 1.0f)));
  const std::string msg = error_of([&] { read_npy(p); });
  EXPECT_NE(msg.find(p), std::string::npos) << msg;
  EXPECT_NE(msg.find("malformed header"), std::string::npos) << msg;

  const std::string q = hand_written("k.npy", "{'descr': '<f4', 'shape': (2,), }", raw(std::vector<float>(2, 1.0f)));
  EXPECT_NE(error_of([&] { read_npy(q); }).find("no 'fortran_order'"), std::string::npos);
}

TEST_F(NpyTest, WriteErrors) {
  const std::string p = path("w.npy");
  std::string msg = error_of([&] { write_npy(p, {2}, DType::BF16, "\0\0\0\0"); });
  EXPECT_NE(msg.find(p), std::string::npos) << msg;
  EXPECT_NE(msg.find("bf16"), std::string::npos) << msg;

  msg = error_of([&] { write_npy(p, {2, 3}, std::vector<double>(5, 0.0)); });
  EXPECT_NE(msg.find("(2, 3) holds 6 elements but 5 were given"), std::string::npos) << msg;

  msg = error_of([&] { write_npy(p, {2, -1}, DType::F32, "\0\0\0\0"); });
  EXPECT_NE(msg.find("negative dimension -1"), std::string::npos) << msg;

  const std::string bad = (dir_ / "no_such_dir" / "w.npy").string();
  msg = error_of([&] { write_npy(bad, {1}, std::vector<float>{1.0f}); });
  EXPECT_NE(msg.find(bad), std::string::npos) << msg;
  EXPECT_NE(msg.find("cannot open for writing"), std::string::npos) << msg;
}

}  // namespace
}  // namespace laga
