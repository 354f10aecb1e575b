// The safetensors writer: the byte layout the format prescribes (length prefix, padded
// JSON header, tiled byte buffer) and a round trip through our reader. The independent
// check is tests/oracle/export_parity.py (Python's `safetensors` reads what we write).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ckpt/safetensors.hpp"
#include "core/bf16.hpp"
#include "core/error.hpp"

namespace {

namespace fs = std::filesystem;
using dst::ckpt::StDType;
using dst::ckpt::StTensor;

// Each test's files in a folder of its own process, removed when the test ends.
class Safetensors : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("dst-safetensors-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string temp_path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

std::vector<unsigned char> bytes_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST_F(Safetensors, LayoutFollowsTheFormat) {
  const std::vector<float> a{1.0f, -2.5f, 3.0f, 0.0f, 5.0f, 6.0f};  // (2, 3)
  const std::vector<float> b{7.0f};                                 // (1)
  const std::string path = temp_path("layout.safetensors");
  const auto size = dst::ckpt::write_safetensors(
      path, {{"model.a.weight", {2, 3}, a.data()}, {"b", {1}, b.data()}}, StDType::f32,
      {{"step", "3"}});
  const auto raw = bytes_of(path);
  ASSERT_EQ(raw.size(), size);
  std::uint64_t n = 0;
  for (int i = 0; i < 8; ++i)
    n |= static_cast<std::uint64_t>(raw[static_cast<std::size_t>(i)]) << (8 * i);
  EXPECT_EQ((8 + n) % 8, 0u) << "data must start 8-byte aligned";
  ASSERT_EQ(raw.size(), 8 + n + 7 * sizeof(float));
  const std::string header(raw.begin() + 8, raw.begin() + 8 + static_cast<long>(n));
  // Padding is trailing spaces only.
  const auto last = header.find_last_not_of(' ');
  EXPECT_EQ(header[last], '}');
  const auto j = nlohmann::json::parse(header);
  EXPECT_EQ(j["__metadata__"]["format"], "pt");
  EXPECT_EQ(j["__metadata__"]["step"], "3");
  EXPECT_EQ(j["model.a.weight"]["dtype"], "F32");
  EXPECT_EQ(j["model.a.weight"]["shape"], nlohmann::json({2, 3}));
  EXPECT_EQ(j["model.a.weight"]["data_offsets"], nlohmann::json({0, 24}));
  EXPECT_EQ(j["b"]["data_offsets"], nlohmann::json({24, 28}));
  // Little-endian f32 bytes, back to back.
  float back[7];
  std::memcpy(back, raw.data() + 8 + n, sizeof back);
  for (int i = 0; i < 6; ++i)
    EXPECT_EQ(back[i], a[static_cast<std::size_t>(i)]);
  EXPECT_EQ(back[6], 7.0f);
  EXPECT_FALSE(fs::exists(path + ".tmp"));
}

TEST_F(Safetensors, RoundTripF32AndBf16) {
  std::vector<float> w(3 * 5 * 7);
  for (std::size_t i = 0; i < w.size(); ++i)
    w[i] = static_cast<float>(i) * 0.37f - 11.0f;
  const std::vector<float> s{0.125f};
  for (StDType d : {StDType::f32, StDType::bf16}) {
    const std::string path = temp_path(d == StDType::f32 ? "f32.safetensors" : "bf16.safetensors");
    dst::ckpt::write_safetensors(path, {{"w", {3, 5, 7}, w.data()}, {"scalar", {}, s.data()}}, d);
    const auto h = dst::ckpt::read_safetensors_header(path);
    ASSERT_EQ(h.tensors.size(), 2u);
    EXPECT_EQ(h.tensors[0].name, "w");
    EXPECT_EQ(h.tensors[0].dtype, d == StDType::f32 ? "F32" : "BF16");
    EXPECT_EQ(h.tensors[0].shape, (std::vector<std::int64_t>{3, 5, 7}));
    EXPECT_TRUE(h.tensors[1].shape.empty());  // a 0-d tensor holds one element
    const auto back = dst::ckpt::read_safetensors_tensor(path, h, "w");
    ASSERT_EQ(back.size(), w.size());
    for (std::size_t i = 0; i < w.size(); ++i) {
      // f32 is pure data movement; bf16 is the one rounding of core/bf16.hpp.
      const float want = d == StDType::f32 ? w[i] : dst::bf16::from_float(w[i]).to_float();
      ASSERT_EQ(back[i], want) << i;
    }
    EXPECT_EQ(dst::ckpt::read_safetensors_tensor(path, h, "scalar")[0], 0.125f);
  }
}

TEST_F(Safetensors, RefusesBadInputAndDamagedFiles) {
  const std::vector<float> a{1.0f, 2.0f};
  const std::string path = temp_path("bad.safetensors");
  EXPECT_THROW(dst::ckpt::write_safetensors(path, {{"x", {2}, a.data()}, {"x", {2}, a.data()}},
                                            StDType::f32),
               dst::Error);
  EXPECT_THROW(dst::ckpt::write_safetensors(path, {{"", {2}, a.data()}}, StDType::f32), dst::Error);
  EXPECT_THROW(dst::ckpt::write_safetensors(path, {{"x", {-1}, a.data()}}, StDType::f32),
               dst::Error);
  EXPECT_THROW(dst::ckpt::write_safetensors("/nonexistent/dir/x.safetensors", {}, StDType::f32),
               dst::Error);
  // A truncated buffer no longer tiles: the reader names it.
  dst::ckpt::write_safetensors(path, {{"x", {2}, a.data()}}, StDType::f32);
  fs::resize_file(path, fs::file_size(path) - 1);
  try {
    dst::ckpt::read_safetensors_header(path);
    FAIL() << "a truncated file was accepted";
  } catch (const dst::Error& e) {
    EXPECT_NE(std::string(e.what()).find("bytes of a"), std::string::npos) << e.what();
  }
}

}  // namespace
