// MetricsLog when its file cannot be written: training goes on, the lost records are
// counted (and said once in the log), and writing resumes when the file takes them again.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "train/metrics.hpp"

namespace {

using dst::train::MetricsLog;

TEST(MetricsLog, CountsTheRecordsAFullDiskLoses) {
  // /dev/full answers every write with ENOSPC, as a full file system does.
  if (!std::filesystem::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  MetricsLog log("/dev/full", true);
  EXPECT_NO_THROW(log.header("model: {}\n", 1, 1.0));
  EXPECT_NO_THROW(log.eval(1, 2.5, 128));
  EXPECT_EQ(log.lost_records(), 2);
}

TEST(MetricsLog, WritesEveryRecordToAWritableFile) {
  const std::string path =
      (std::filesystem::temp_directory_path() / "dstrain_metrics_log_test.jsonl").string();
  std::filesystem::remove(path);
  {
    MetricsLog log(path, true);
    log.header("model: {}\n", 1, 1.0);
    log.eval(1, 2.5, 128);
    EXPECT_EQ(log.lost_records(), 0);
  }
  std::ifstream in(path);
  std::string line;
  int lines = 0;
  while (std::getline(in, line))
    ++lines;
  EXPECT_EQ(lines, 2);
  std::filesystem::remove(path);
}

TEST(MetricsLog, ANonWriterWritesNothingAndLosesNothing) {
  MetricsLog log("/dev/full", false);
  log.eval(1, 2.5, 128);
  EXPECT_EQ(log.lost_records(), 0);
}

}  // namespace
