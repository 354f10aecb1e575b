// Collective checkpoints under MPI (1, 2 and 4 ranks): save/read round trip, the
// collective write (each rank writes about 1/N of the bytes, HDF5 reports collective
// I/O), checksums equal to a serial computation, the commit protocol (latest, keep_last,
// leftovers), and every refusal of a damaged or foreign file, thrown alike on all ranks.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <mpi.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>

#include "ckpt/checkpoint.hpp"
#include "ckpt/manifest.hpp"
#include "mpi_world.hpp"

namespace dst::ckpt {
namespace {

using dst::test::world_rank;
using dst::test::world_size;

namespace fs = std::filesystem;
using Kind = CheckpointError::Kind;

constexpr double kTimeout = 60;

// A folder made by rank 0, its name broadcast; removed by rank 0 once every rank is done.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& tag) {
    if (world_rank() == 0) {
      path_ = (fs::temp_directory_path() / ("dst_ckpt_" + tag + "_" + std::to_string(::getpid())))
                  .string();
      fs::remove_all(path_);
    }
    int n = static_cast<int>(path_.size());
    MPI_Bcast(&n, 1, MPI_INT, 0, MPI_COMM_WORLD);
    path_.resize(n);
    MPI_Bcast(path_.data(), n, MPI_CHAR, 0, MPI_COMM_WORLD);
  }
  ~ScratchDir() {
    MPI_Barrier(MPI_COMM_WORLD);
    if (world_rank() == 0) fs::remove_all(path_);
  }
  const std::string& str() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

struct Tensor {
  std::string name;
  std::vector<std::int64_t> shape;
  std::vector<float> data;
};

std::uint64_t numel(const std::vector<std::int64_t>& shape) {
  std::uint64_t n = 1;
  for (auto d : shape)
    n *= static_cast<std::uint64_t>(d);
  return n;
}

// A small model's worth of tensors: dotted names in nested groups, one tensor of exactly
// one checksum block, tensors of several blocks, a scalar and an empty one. Values are a
// fixed function of (tensor index, element), identical on every rank.
std::vector<Tensor> make_tensors(float salt = 0.0f) {
  std::vector<Tensor> ts = {
      {"params/model.embed_tokens.weight", {300, 64}, {}},
      {"params/model.layers.0.mlp.up_proj.weight", {700, 600}, {}},  // 1.6 MiB: 2 blocks
      {"params/model.norm.weight", {64}, {}},
      {"params/model.block", {262144}, {}},  // exactly one 1 MiB block
      {"params/model.scalar", {}, {}},
      {"params/model.empty", {0, 8}, {}},
      {"params/model.cube", {5, 3, 7}, {}},
      {"optimizer/exp_avg/model.layers.0.mlp.up_proj.weight", {700, 600}, {}},
      {"optimizer/exp_avg_sq/model.norm.weight", {64}, {}},
  };
  for (std::size_t k = 0; k < ts.size(); ++k) {
    ts[k].data.resize(numel(ts[k].shape));
    for (std::size_t i = 0; i < ts[k].data.size(); ++i)
      ts[k].data[i] =
          static_cast<float>((i * 2654435761ull + k * 97) % 1000003) / 1000003.0f - 0.5f + salt;
  }
  return ts;
}

std::vector<TensorRef> refs(const std::vector<Tensor>& ts) {
  std::vector<TensorRef> out;
  for (const auto& t : ts)
    out.push_back({t.name, t.shape, t.data.data()});
  return out;
}

Metadata make_meta(std::int64_t step) {
  Metadata m;
  m.step = step;
  m.epoch = 2;
  m.consumed = 123;
  m.samples_seen = 4567;
  m.optimizer_steps = step - 1;
  m.skipped_steps = 1;
  m.seed = 0xfeedfacecafebeefull;
  m.rng = "philox4x32 seed 42 stream 7";
  m.loss_scale = 32768.0;
  m.loss_scale_clean_steps = 17;
  m.deck_yaml = "run:\n  seed: 42\nmodel:\n  preset: tiny\n";
  m.software_version = "dstrain test";
  m.world_size = world_size();
  m.data_parallel = world_size();
  m.global_batch_size = 16;
  m.micro_batch_size = 4;
  m.grad_accum_steps = 1;
  return m;
}

IoStats save_step(Directory& dir, std::int64_t step, const std::vector<Tensor>& ts,
                  std::int64_t keep_last = 0) {
  return dir.save(make_meta(step), refs(ts), keep_last);
}

// Runs f on every rank and expects the same CheckpointError of `kind` everywhere, its
// message containing each of `parts`; returns the message.
std::string expect_error(const std::function<void()>& f, Kind kind,
                         const std::vector<std::string>& parts) {
  std::string message;
  try {
    f();
    ADD_FAILURE() << "no CheckpointError on rank " << world_rank();
    return message;
  } catch (const CheckpointError& e) {
    message = e.what();
    EXPECT_EQ(static_cast<int>(e.kind()), static_cast<int>(kind)) << message;
  }
  for (const auto& p : parts)
    EXPECT_NE(message.find(p), std::string::npos) << message;
  // The same message on every rank: compare with rank 0's.
  std::string root = message;
  int n = static_cast<int>(root.size());
  MPI_Bcast(&n, 1, MPI_INT, 0, MPI_COMM_WORLD);
  root.resize(n);
  MPI_Bcast(root.data(), n, MPI_CHAR, 0, MPI_COMM_WORLD);
  EXPECT_EQ(message, root);
  return message;
}

// Rank 0 changes a committed file on purpose (the others wait).
void on_rank0(const std::function<void()>& f) {
  if (world_rank() == 0) f();
  MPI_Barrier(MPI_COMM_WORLD);
}

// Re-commits a file changed on purpose: a manifest matching its new bytes.
void rewrite_manifest(const std::string& file, std::int64_t step) {
  write_manifest(manifest_path(file), describe_file(file, step, "2025-01-01T00:00:00Z"));
}

// The byte offset of a dataset's data in the file (serial HDF5, rank 0 only).
haddr_t dataset_offset(const std::string& file, const std::string& name) {
  const hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  const hid_t d = H5Dopen2(f, name.c_str(), H5P_DEFAULT);
  const haddr_t at = H5Dget_offset(d);
  H5Dclose(d);
  H5Fclose(f);
  return at;
}

void flip_byte(const std::string& file, std::uint64_t at) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(at));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x5a);
  f.seekp(static_cast<std::streamoff>(at));
  f.write(&c, 1);
}

TEST(Checkpoint, RoundTripIsBitExactWithMetadata) {
  ScratchDir dir("roundtrip");
  Directory d(MPI_COMM_WORLD, dir.str(), kTimeout);
  EXPECT_EQ(d.clean_leftovers(), 0);
  const auto ts = make_tensors();
  save_step(d, 12, ts);
  EXPECT_EQ(d.latest(), dir.file("step-12.h5"));

  Reader r(MPI_COMM_WORLD, d.latest(), kTimeout);
  const Metadata want = make_meta(12);
  const Metadata& got = r.metadata();
  EXPECT_EQ(got.format_version, kFormatVersion);
  EXPECT_EQ(got.step, 12);
  EXPECT_EQ(got.epoch, want.epoch);
  EXPECT_EQ(got.consumed, want.consumed);
  EXPECT_EQ(got.samples_seen, want.samples_seen);
  EXPECT_EQ(got.optimizer_steps, want.optimizer_steps);
  EXPECT_EQ(got.skipped_steps, want.skipped_steps);
  EXPECT_EQ(got.seed, want.seed);
  EXPECT_EQ(got.rng, want.rng);
  EXPECT_EQ(got.loss_scale, want.loss_scale);
  EXPECT_EQ(got.loss_scale_clean_steps, want.loss_scale_clean_steps);
  EXPECT_EQ(got.deck_yaml, want.deck_yaml);
  EXPECT_EQ(got.software_version, want.software_version);
  EXPECT_EQ(got.created_utc.size(), 20u) << got.created_utc;  // 2025-01-31T12:00:00Z
  EXPECT_EQ(got.world_size, want.world_size);
  EXPECT_EQ(got.data_parallel, want.data_parallel);
  EXPECT_EQ(got.global_batch_size, 16);
  EXPECT_EQ(got.micro_batch_size, 4);
  EXPECT_EQ(got.grad_accum_steps, 1);

  ASSERT_EQ(r.tensors().size(), ts.size());
  for (const auto& t : ts) {
    const TensorInfo* info = r.find(t.name);
    ASSERT_NE(info, nullptr) << t.name;
    EXPECT_EQ(info->shape, t.shape) << t.name;
    EXPECT_EQ(info->dtype, "f32");
    std::vector<float> back(t.data.size() + 1, -7.0f);  // one guard element
    r.read(t.name, t.shape, back.data());
    // Pure data movement: bit-exact.
    EXPECT_EQ(std::memcmp(back.data(), t.data.data(), t.data.size() * sizeof(float)), 0) << t.name;
    EXPECT_EQ(back.back(), -7.0f) << t.name << ": read past the tensor";
  }
  EXPECT_TRUE(r.verify_all().empty());
  EXPECT_TRUE(r.stats().collective);
}

TEST(Checkpoint, WriteIsCollectiveAndSplitEvenly) {
  ScratchDir dir("collective");
  Directory d(MPI_COMM_WORLD, dir.str(), kTimeout);
  const auto ts = make_tensors();
  const IoStats s = save_step(d, 1, ts);
  std::uint64_t total = 0, widest_row = 0;
  for (const auto& t : ts) {
    total += t.data.size() * sizeof(float);
    if (t.shape.size() > 1) widest_row = std::max<std::uint64_t>(widest_row, t.shape[1] * 4);
  }
  EXPECT_TRUE(s.collective) << "H5Pget_mpio_actual_io_mode reported independent I/O";
  EXPECT_GT(s.bytes, total);  // tensors plus metadata
  EXPECT_GT(s.seconds, 0.0);
  EXPECT_GE(s.total_seconds, s.seconds);
  // Each rank wrote its share (within a row per range boundary), and the shares add up.
  const double share = static_cast<double>(total) / world_size();
  EXPECT_NEAR(static_cast<double>(s.bytes_this_rank), share, 2.0 * widest_row);
  std::uint64_t sum = s.bytes_this_rank;
  MPI_Allreduce(MPI_IN_PLACE, &sum, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
  EXPECT_EQ(sum, total);

  Reader r(MPI_COMM_WORLD, dir.file("step-1.h5"), kTimeout);
  for (const auto& t : ts) {
    std::vector<float> back(t.data.size());
    r.read(t.name, t.shape, back.data());
  }
  const IoStats rs = r.stats();
  EXPECT_TRUE(rs.collective);
  EXPECT_EQ(rs.bytes, s.bytes);
  std::uint64_t read_sum = rs.bytes_this_rank;
  MPI_Allreduce(MPI_IN_PLACE, &read_sum, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
  EXPECT_EQ(read_sum, total);
}

TEST(Checkpoint, StoredChecksumsEqualSerialComputation) {
  ScratchDir dir("checksums");
  Directory d(MPI_COMM_WORLD, dir.str(), kTimeout);
  const auto ts = make_tensors();
  save_step(d, 3, ts);
  Reader r(MPI_COMM_WORLD, dir.file("step-3.h5"), kTimeout);
  for (const auto& t : ts) {
    ASSERT_NE(r.find(t.name), nullptr);
    // What one rank alone computes: the file does not depend on how many wrote it.
    EXPECT_EQ(r.find(t.name)->checksum, tensor_checksum(t.data.data(), t.data.size())) << t.name;
  }
}

// A streamed save (Directory::save with a TensorSource): each tensor produced when it is
// written, into one reused buffer, in order, once; the file holds the same tensors and
// checksums as a save of the whole tensors, and reads back bit for bit.
TEST(Checkpoint, StreamedSaveWritesTheSameTensorsOneAtATime) {
  ScratchDir dir("streamed");
  Directory d(MPI_COMM_WORLD, dir.str(), kTimeout);
  const auto ts = make_tensors();
  std::vector<TensorRef> shapes = refs(ts);
  for (auto& t : shapes)
    t.data = nullptr;  // names and shapes only
  std::vector<float> buffer;
  std::vector<std::size_t> calls;
  const IoStats s = d.save(
      make_meta(4), shapes,
      [&](std::size_t i) {
        calls.push_back(i);
        buffer.assign(ts[i].data.begin(), ts[i].data.end());
        return buffer.data();
      },
      0);
  std::vector<std::size_t> order(ts.size());
  for (std::size_t i = 0; i < order.size(); ++i)
    order[i] = i;
  EXPECT_EQ(calls, order);
  EXPECT_TRUE(s.collective);
  Reader r(MPI_COMM_WORLD, dir.file("step-4.h5"), kTimeout);
  ASSERT_EQ(r.tensors().size(), ts.size());
  for (const auto& t : ts) {
    ASSERT_NE(r.find(t.name), nullptr) << t.name;
    EXPECT_EQ(r.find(t.name)->checksum, tensor_checksum(t.data.data(), t.data.size())) << t.name;
    std::vector<float> back(t.data.size());
    r.read(t.name, t.shape, back.data());
    EXPECT_EQ(std::memcmp(back.data(), t.data.data(), t.data.size() * sizeof(float)), 0) << t.name;
  }
  EXPECT_TRUE(r.verify_all().empty());
  // A source without data for a non-empty tensor is an error on every rank, and nothing is
  // committed.
  expect_error(
      [&] {
        d.save(
            make_meta(5), shapes, [](std::size_t) { return nullptr; }, 0);
      },
      Kind::io, {"has no data"});
  EXPECT_EQ(d.latest(), dir.file("step-4.h5"));
}

TEST(Checkpoint, LatestAndKeepLast) {
  ScratchDir dir("keep");
  Directory d(MPI_COMM_WORLD, dir.str(), kTimeout);
  EXPECT_EQ(d.latest(), "");
  EXPECT_TRUE(d.committed().empty());
  for (std::int64_t step : {2, 4, 6, 8}) {
    save_step(d, step, make_tensors(static_cast<float>(step)), 2);
    EXPECT_EQ(d.latest(), dir.file("step-" + std::to_string(step) + ".h5"));
  }
  EXPECT_EQ(d.committed(),
            (std::vector<std::string>{dir.file("step-8.h5"), dir.file("step-6.h5")}));
  for (const char* gone :
       {"step-2.h5", "step-4.h5", "step-2.manifest.json", "step-4.manifest.json"})
    EXPECT_FALSE(fs::exists(dir.file(gone))) << gone;
  std::ifstream latest(dir.file("latest"));
  std::string name;
  std::getline(latest, name);
  EXPECT_EQ(name, "step-8.h5");
  // The pruned files were the older ones: step 6 still reads back step 6's tensors.
  Reader r(MPI_COMM_WORLD, dir.file("step-6.h5"), kTimeout);
  EXPECT_EQ(r.metadata().step, 6);
  const auto six = make_tensors(6.0f);
  std::vector<float> back(six[2].data.size());
  r.read(six[2].name, six[2].shape, back.data());
  EXPECT_EQ(back, six[2].data);
}

TEST(Checkpoint, LeftoverTmpIsNeverLoadedAndIsCleaned) {
  ScratchDir dir("leftover");
  Directory d(MPI_COMM_WORLD, dir.str(), kTimeout);
  save_step(d, 5, make_tensors());
  on_rank0([&] {
    // What an interrupted save leaves: a partial file (and possibly a manifest's .tmp).
    std::ofstream(dir.file("step-9.h5.tmp")) << "partial HDF5 bytes";
    std::ofstream(dir.file("step-9.manifest.json.tmp")) << "{";
  });
  EXPECT_EQ(d.committed(), std::vector<std::string>{dir.file("step-5.h5")});
  EXPECT_EQ(d.latest(), dir.file("step-5.h5"));
  // Even named directly, a .tmp is not opened: it has no manifest.
  expect_error([&] { Reader(MPI_COMM_WORLD, dir.file("step-9.h5.tmp"), kTimeout); }, Kind::manifest,
               {"step-9.h5.tmp", "manifest"});
  EXPECT_EQ(d.clean_leftovers(), 2);
  EXPECT_FALSE(fs::exists(dir.file("step-9.h5.tmp")));
  EXPECT_FALSE(fs::exists(dir.file("step-9.manifest.json.tmp")));
  EXPECT_TRUE(fs::exists(dir.file("step-5.h5")));
  EXPECT_EQ(d.clean_leftovers(), 0);
}

TEST(Checkpoint, FlippedByteFailsManifestThenChecksum) {
  ScratchDir dir("flip");
  Directory d(MPI_COMM_WORLD, dir.str(), kTimeout);
  const auto ts = make_tensors();
  save_step(d, 7, ts);
  const std::string file = dir.file("step-7.h5");
  const std::string victim = "params/model.layers.0.mlp.up_proj.weight";
  on_rank0([&] { flip_byte(file, dataset_offset(file, victim) + 1234567); });  // block 2
  expect_error([&] { Reader(MPI_COMM_WORLD, file, kTimeout); }, Kind::manifest,
               {file, "xxh64", "manifest"});

  // A manifest that vouches for the damaged bytes: HDF5 opens it, the tensor's checksum
  // still catches the damage, and only that tensor's.
  on_rank0([&] { rewrite_manifest(file, 7); });
  Reader r(MPI_COMM_WORLD, file, kTimeout);
  std::vector<float> back(700 * 600);
  expect_error(
      [&] {
        r.read(victim, {700, 600}, back.data());
      },
      Kind::checksum, {victim, file, "checksum"});
  r.read(ts[0].name, ts[0].shape, back.data());  // another tensor is intact
  EXPECT_EQ(r.verify_all(), std::vector<std::string>{victim});
}

TEST(Checkpoint, MissingManifestIsRefused) {
  ScratchDir dir("nomanifest");
  Directory d(MPI_COMM_WORLD, dir.str(), kTimeout);
  save_step(d, 4, make_tensors());
  on_rank0([&] { fs::remove(dir.file("step-4.manifest.json")); });
  EXPECT_TRUE(d.committed().empty());
  expect_error([&] { Reader(MPI_COMM_WORLD, dir.file("step-4.h5"), kTimeout); }, Kind::manifest,
               {"step-4.manifest.json", "missing", "never committed"});
  expect_error([&] { Reader(MPI_COMM_WORLD, dir.file("step-99.h5"), kTimeout); }, Kind::missing,
               {"step-99.h5"});
}

TEST(Checkpoint, WrongShapeOrNameIsMismatch) {
  ScratchDir dir("shape");
  Directory d(MPI_COMM_WORLD, dir.str(), kTimeout);
  save_step(d, 1, make_tensors());
  Reader r(MPI_COMM_WORLD, dir.file("step-1.h5"), kTimeout);
  std::vector<float> back(64 * 300);
  expect_error(
      [&] {
        r.read("params/model.embed_tokens.weight", {64, 300}, back.data());
      },
      Kind::mismatch, {"params/model.embed_tokens.weight", "(300, 64)", "(64, 300)"});
  expect_error([&] { r.read("params/model.nope", {4}, back.data()); }, Kind::mismatch,
               {"params/model.nope"});
}

TEST(Checkpoint, OtherFormatVersionIsRefused) {
  ScratchDir dir("version");
  Directory d(MPI_COMM_WORLD, dir.str(), kTimeout);
  save_step(d, 2, make_tensors());
  const std::string file = dir.file("step-2.h5");
  on_rank0([&] {
    const hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    const hid_t a = H5Aopen(f, "format_version", H5P_DEFAULT);
    const std::int64_t v = kFormatVersion + 1;
    H5Awrite(a, H5T_NATIVE_INT64, &v);
    H5Aclose(a);
    H5Fclose(f);
    rewrite_manifest(file, 2);
  });
  expect_error([&] { Reader(MPI_COMM_WORLD, file, kTimeout); }, Kind::format,
               {file, "format version " + std::to_string(kFormatVersion + 1)});
}

TEST(Checkpoint, FailureOnOneRankIsAgreedAndKeepsPreviousCheckpoint) {
  ScratchDir dir("agree");
  Directory d(MPI_COMM_WORLD, dir.str(), kTimeout);
  const auto ts = make_tensors();
  save_step(d, 1, ts);
  // The last rank alone passes a tensor without data: every rank reports it.
  auto bad = refs(ts);
  if (world_rank() == world_size() - 1) bad[1].data = nullptr;
  expect_error([&] { d.save(make_meta(2), bad, 0); }, Kind::io,
               {"rank " + std::to_string(world_size() - 1), bad[1].name, "no data"});
  // HDF5 cannot create the file (a directory is in the way): the same error everywhere.
  on_rank0([&] { fs::create_directories(dir.file("step-3.h5.tmp")); });
  expect_error([&] { save_step(d, 3, ts); }, Kind::io, {"step-3.h5.tmp"});
  EXPECT_FALSE(fs::exists(dir.file("step-3.h5.tmp")));
  EXPECT_FALSE(fs::exists(dir.file("step-2.h5.tmp")));
  EXPECT_EQ(d.committed(), std::vector<std::string>{dir.file("step-1.h5")});
  EXPECT_EQ(d.latest(), dir.file("step-1.h5"));
  Reader r(MPI_COMM_WORLD, d.latest(), kTimeout);
  EXPECT_TRUE(r.verify_all().empty());
}

TEST(Checkpoint, ResavingAStepReplacesIt) {
  ScratchDir dir("resave");
  Directory d(MPI_COMM_WORLD, dir.str(), kTimeout);
  save_step(d, 3, make_tensors(0.0f));
  save_step(d, 3, make_tensors(1.0f));
  Reader r(MPI_COMM_WORLD, dir.file("step-3.h5"), kTimeout);
  const auto want = make_tensors(1.0f);
  std::vector<float> back(want[2].data.size());
  r.read(want[2].name, want[2].shape, back.data());
  EXPECT_EQ(back, want[2].data);
}

}  // namespace
}  // namespace dst::ckpt
