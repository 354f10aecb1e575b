// Checkpoint file names, the manifest's JSON round trip and its refusals, and the
// whole-file hash against the xxhsum command line tool's value for the same bytes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "ckpt/checkpoint.hpp"
#include "ckpt/detail/files.hpp"
#include "ckpt/manifest.hpp"

namespace {

namespace fs = std::filesystem;
using dst::ckpt::CheckpointError;
using namespace dst::ckpt;

class ManifestTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("dst_ckpt_manifest_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

TEST(CheckpointNames, StepNamesAreUnpaddedDecimal) {
  EXPECT_EQ(detail::checkpoint_name(0), "step-0.h5");
  EXPECT_EQ(detail::checkpoint_name(1200), "step-1200.h5");
  EXPECT_EQ(detail::parse_checkpoint_name("step-1200.h5"), 1200);
  EXPECT_EQ(detail::parse_checkpoint_name("step-0.h5"), 0);
  for (const char* not_ours : {"step-007.h5", "step-.h5", "step-1.h5.tmp", "step--1.h5",
                               "step-1x.h5", "latest", "step-1.manifest.json"})
    EXPECT_FALSE(detail::parse_checkpoint_name(not_ours).has_value()) << not_ours;
  EXPECT_EQ(manifest_path("/a/b/step-3.h5"), "/a/b/step-3.manifest.json");
}

TEST_F(ManifestTest, FileHashMatchesXxhsum) {
  // "The quick brown fox jumps over the lazy dog" (no newline): `xxhsum -H64` prints
  // 0b242d361fda71bc.
  std::ofstream(path("fox.bin"), std::ios::binary) << "The quick brown fox jumps over the lazy dog";
  EXPECT_EQ(hex64(file_xxh64(path("fox.bin"))), "0b242d361fda71bc");
}

TEST_F(ManifestTest, RoundTripAndDescribe) {
  std::ofstream(path("step-5.h5"), std::ios::binary) << "not really hdf5";
  const Manifest m = describe_file(path("step-5.h5"), 5, "2025-01-01T00:00:00Z");
  EXPECT_EQ(m.file, "step-5.h5");
  EXPECT_EQ(m.size, 15u);
  write_manifest(path("step-5.manifest.json"), m);
  EXPECT_FALSE(fs::exists(path("step-5.manifest.json.tmp")));
  const Manifest back = read_manifest(path("step-5.manifest.json"));
  EXPECT_EQ(back.file, m.file);
  EXPECT_EQ(back.size, m.size);
  EXPECT_EQ(back.xxh64, m.xxh64);
  EXPECT_EQ(back.step, 5);
  EXPECT_EQ(back.manifest_version, kManifestVersion);
  EXPECT_EQ(back.checkpoint_format_version, kFormatVersion);
  EXPECT_EQ(back.created_utc, "2025-01-01T00:00:00Z");
}

TEST_F(ManifestTest, RefusesMissingForeignAndBrokenManifests) {
  const auto kind_of = [&](const std::string& text) {
    if (!text.empty()) std::ofstream(path("m.json")) << text;
    try {
      read_manifest(path(text.empty() ? "absent.json" : "m.json"));
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find(text.empty() ? "absent.json" : "m.json"),
                std::string::npos)
          << e.what();
      return e.kind();
    }
    return CheckpointError::Kind::io;  // not refused: the test below fails
  };
  EXPECT_EQ(kind_of(""), CheckpointError::Kind::manifest);
  EXPECT_EQ(kind_of("{not json"), CheckpointError::Kind::manifest);
  EXPECT_EQ(kind_of(R"({"format": "something-else"})"), CheckpointError::Kind::manifest);
  EXPECT_EQ(kind_of(R"({"format": "dstrain-checkpoint-manifest", "manifest_version": 99})"),
            CheckpointError::Kind::manifest);
  EXPECT_EQ(kind_of(R"({"format": "dstrain-checkpoint-manifest", "manifest_version": 1,
      "checkpoint_format_version": 1, "file": "step-1.h5", "size": 3, "xxh64": "xyz",
      "step": 1, "created_utc": ""})"),
            CheckpointError::Kind::manifest);
}

}  // namespace
