// The name tables of the deck's enumerated settings (core/enum_names.hpp, run_config.hpp):
// every name parses to its enumerator and back, nothing else parses, and checkpoint.resume
// reads auto | none | a path.
#include <gtest/gtest.h>

#include <optional>
#include <set>
#include <string>

#include "config/run_config.hpp"
#include "core/enum_names.hpp"

namespace dst::config {
namespace {

template <class E>
void expect_round_trip(const std::string& choices) {
  const auto& names = EnumNames<E>::names;
  EXPECT_EQ(enum_choices<E>(), choices);
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()).size(), names.size())
      << "a name appears twice";
  for (std::size_t i = 0; i < names.size(); ++i) {
    const auto e = static_cast<E>(i);
    EXPECT_EQ(to_string(e), names[i]);
    EXPECT_EQ(parse_enum<E>(names[i]), std::optional<E>(e)) << names[i];
  }
  EXPECT_EQ(to_string(static_cast<E>(names.size())), "<invalid>");
  EXPECT_EQ(parse_enum<E>(""), std::nullopt);
}

TEST(EnumNames, EveryDeckEnumRoundTrips) {
  expect_round_trip<DataFormat>("auto, hdf5, text");
  expect_round_trip<OptimizerType>("adamw");
  expect_round_trip<ScheduleType>("constant, cosine, linear, inverse_sqrt, multistep");
  expect_round_trip<WorldSizeScaling>("none, linear, sqrt");
  expect_round_trip<Precision>("fp32, bf16, fp16");
  expect_round_trip<ParallelBackend>("auto, mpi, shm, nccl");
  expect_round_trip<KernelsBackend>("auto, kokkos, cuda");
  expect_round_trip<HostGemmSetting>("auto, blas, dstrain");
  expect_round_trip<NanPolicy>("abort, skip");
}

TEST(EnumNames, NamesAreExact) {
  EXPECT_EQ(parse_enum<Precision>("FP32"), std::nullopt);
  EXPECT_EQ(parse_enum<Precision>("fp32 "), std::nullopt);
  EXPECT_EQ(parse_enum<ParallelBackend>("automatic"), std::nullopt);  // the deck says auto
  EXPECT_EQ(parse_enum<ParallelBackend>("auto"), ParallelBackend::automatic);
}

TEST(ResumeSetting, AutoNoneOrAPath) {
  EXPECT_EQ(ResumeSetting::parse("auto").kind, ResumeSetting::Kind::automatic);
  EXPECT_EQ(ResumeSetting::parse("none").kind, ResumeSetting::Kind::none);
  const ResumeSetting path = ResumeSetting::parse("runs/a/checkpoints/step-100");
  EXPECT_EQ(path.kind, ResumeSetting::Kind::path);
  EXPECT_EQ(path.path, "runs/a/checkpoints/step-100");
  for (const char* text : {"auto", "none", "/ckpt/step-7", "Auto"})
    EXPECT_EQ(ResumeSetting::parse(text).text(), text);
  EXPECT_EQ(ResumeSetting::parse("Auto").kind, ResumeSetting::Kind::path);
  EXPECT_EQ(ResumeSetting{}, ResumeSetting::parse("auto"));
  EXPECT_NE(ResumeSetting::parse("/a"), ResumeSetting::parse("/b"));
}

}  // namespace
}  // namespace dst::config
