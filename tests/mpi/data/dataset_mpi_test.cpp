// The dataset reader and sampler under MPI (1, 2 and 4 ranks): rank 0 writes a dataset,
// every rank reads its own samples, and the result is compared with the known token
// stream and with a serial read on rank 0.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>

#include "data/dataset/batch_reader.hpp"
#include "data/dataset/sampler.hpp"
#include "data/dataset/token_dataset.hpp"
#include "dataset_test_util.hpp"
#include "h5/lock.hpp"
#include "mpi_world.hpp"

namespace dst::data {
namespace {

using dst::test::world_rank;
using dst::test::world_size;

constexpr int kSeqLen = 16;

// Shards of the corpus: a (documents 0..119), b (one document of 3 tokens + EOS: shorter
// than a sample, so one sample spans a, b and c), bb (empty), c (documents 121..210).
struct Corpus {
  Corpus() = default;
  Corpus(Corpus&&) = default;
  // Rank 0 removes the folder: not before every rank has stopped reading from it.
  ~Corpus() {
    if (dir) MPI_Barrier(MPI_COMM_WORLD);
  }
  std::unique_ptr<test::ScratchDir> dir;
  std::vector<std::int32_t> stream;  // (num_tokens,) what the reader must produce
};

// Rank 0 writes; the folder's name is broadcast so every rank uses the same one.
Corpus make_corpus(const std::string& tag) {
  Corpus c;
  std::string name;
  if (world_rank() == 0) {
    c.dir = std::make_unique<test::ScratchDir>(tag);
    name = c.dir->str();
    test::write_corpus_shard(c.dir->file("a.h5"), 0, 120);
    ShardWriter b(c.dir->file("b.h5"), test::byte_options());
    b.append_document({7, 8, 9});
    b.close();
    ShardWriter(c.dir->file("bb.h5"), test::byte_options()).close();  // empty: never opened
    test::write_corpus_shard(c.dir->file("c.h5"), 121, 90);
  }
  unsigned long len = name.size();
  MPI_Bcast(&len, 1, MPI_UNSIGNED_LONG, 0, MPI_COMM_WORLD);
  name.resize(len);
  MPI_Bcast(name.data(), static_cast<int>(len), MPI_CHAR, 0, MPI_COMM_WORLD);
  if (world_rank() != 0) c.dir = std::make_unique<test::ScratchDir>(name, /*owner=*/false);
  c.stream = test::corpus_stream(0, 120);
  for (const int t : {7, 8, 9, static_cast<int>(kByteEos)})
    c.stream.push_back(t);
  const auto tail = test::corpus_stream(121, 90);
  c.stream.insert(c.stream.end(), tail.begin(), tail.end());
  MPI_Barrier(MPI_COMM_WORLD);
  return c;
}

std::vector<std::int32_t> expected_sample(const Corpus& c, std::uint64_t id) {
  const auto first = c.stream.begin() + static_cast<std::ptrdiff_t>(id * kSeqLen);
  return {first, first + kSeqLen + 1};
}

std::vector<std::int32_t> row(const Batch& b, std::size_t r) {
  return {b.row(r), b.row(r) + b.cols()};
}

TEST(Dataset, OpensAndCountsSamples) {
  const Corpus c = make_corpus("mpi_open");
  const TokenDataset ds = open_dataset(MPI_COMM_WORLD, c.dir->str(), kSeqLen);
  ASSERT_EQ(ds.shards().size(), 4u);
  EXPECT_EQ(ds.num_tokens(), c.stream.size());
  EXPECT_EQ(ds.num_samples(), (c.stream.size() - 1) / kSeqLen);
  EXPECT_EQ(ds.vocab_size(), 260u);
  EXPECT_EQ(ds.eos_id(), 257u);
  // Through a manifest and a glob too.
  if (world_rank() == 0)
    std::ofstream(c.dir->file("train.manifest")) << "a.h5\nb.h5\nbb.h5\nc.h5\n";
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT_EQ(open_dataset(MPI_COMM_WORLD, c.dir->file("train.manifest"), kSeqLen).num_tokens(),
            c.stream.size());
  EXPECT_EQ(open_dataset(MPI_COMM_WORLD, c.dir->str() + "/*.h5", kSeqLen).num_tokens(),
            c.stream.size());
  EXPECT_THROW(open_dataset(MPI_COMM_WORLD, c.dir->str(), 100000), DatasetError);
}

// Every sample, read by one rank through the prefetching reader, including the ones
// that cross document ends (EOS inside) and shard ends (a -> b -> c).
TEST(Dataset, EverySampleMatchesTheTokenStream) {
  const Corpus c = make_corpus("mpi_all");
  const TokenDataset ds = open_dataset(MPI_COMM_WORLD, c.dir->str(), kSeqLen);
  BatchReader reader(ds);
  std::vector<std::uint64_t> ids(ds.num_samples());
  for (std::uint64_t i = 0; i < ids.size(); ++i)
    ids[i] = i;
  // Rank r reads every sample in a rotated order, in batches of 5.
  std::rotate(ids.begin(), ids.begin() + world_rank() % 7, ids.end());
  std::size_t crossing_shards = 0, crossing_docs = 0;
  const std::uint64_t a_end = ds.shard_start(1), c_start = ds.shard_start(3);
  for (std::size_t k = 0; k < ids.size(); k += 5) {
    reader.request({ids.begin() + k, ids.begin() + std::min(ids.size(), k + 5)});
    const Batch b = reader.wait();
    ASSERT_EQ(b.cols(), static_cast<std::size_t>(kSeqLen + 1));
    for (std::size_t r = 0; r < b.rows(); ++r) {
      const std::uint64_t id = b.sample_ids[r];
      ASSERT_EQ(row(b, r), expected_sample(c, id)) << "sample " << id;
      const std::uint64_t lo = id * kSeqLen, hi = lo + kSeqLen + 1;
      if (lo < a_end && hi > c_start) ++crossing_shards;  // spans a, b and c
      const auto x = row(b, r);
      if (std::find(x.begin(), x.end() - 1, kByteEos) != x.end() - 1) ++crossing_docs;
    }
  }
  EXPECT_EQ(crossing_shards, 1u);  // the corpus is built so that exactly one does
  EXPECT_GT(crossing_docs, ds.num_samples() / 2);
  const auto st = reader.stats();
  EXPECT_EQ(st.shard_opens, 3u);  // lazily, once each (<= max_open_shards), bb never
}

// The training pattern: the sampler hands each rank its block of every step, ranks read
// with prefetching, and the gathered batches equal a serial read of the global batches.
TEST(Dataset, RanksReadDisjointSamplesThatMatchASerialRead) {
  const Corpus c = make_corpus("mpi_par");
  const TokenDataset ds = open_dataset(MPI_COMM_WORLD, c.dir->str(), kSeqLen);
  const int size = world_size(), rank = world_rank();
  SamplerConfig sc;
  sc.num_samples = ds.num_samples();
  sc.seed = 5;
  sc.global_batch_size = 8;
  sc.micro_batch_size = 2;  // 4, 2 or 1 micro-batches per step at 1, 2, 4 ranks
  sc.dp_rank = rank;
  sc.dp_size = size;
  Sampler sampler(sc);
  const int steps = 20;

  BatchReaderOptions opt;
  opt.inject_read_delay_ms = 1;  // exercise the delayed path; the result must not change
  BatchReader reader(ds, opt);
  std::vector<std::int32_t> mine;  // (steps, G / size, T+1)
  std::vector<std::uint64_t> my_ids;
  auto first = sampler.next_step();
  for (const auto& mb : first)
    reader.request(mb);
  for (int s = 0; s < steps; ++s) {
    std::vector<std::vector<std::uint64_t>> next;
    if (s + 1 < steps) next = sampler.next_step();
    for (std::size_t m = 0; m < sampler.micro_batches_per_step(); ++m) {
      const Batch b = reader.wait();
      // Keep the reader one step ahead, as the trainer will.
      if (!next.empty()) reader.request(next[m]);
      mine.insert(mine.end(), b.tokens.begin(), b.tokens.end());
      my_ids.insert(my_ids.end(), b.sample_ids.begin(), b.sample_ids.end());
    }
  }
  EXPECT_EQ(reader.outstanding(), 0u);

  // Gather to rank 0, step by step in rank order: (steps, G, T+1).
  const std::size_t per_step = 8 / size;
  std::vector<std::int32_t> all(rank == 0 ? mine.size() * size : 0);
  std::vector<std::uint64_t> all_ids(rank == 0 ? my_ids.size() * size : 0);
  for (int s = 0; s < steps; ++s) {
    MPI_Gather(mine.data() + s * per_step * (kSeqLen + 1),
               static_cast<int>(per_step * (kSeqLen + 1)), MPI_INT32_T,
               rank == 0 ? all.data() + s * 8 * (kSeqLen + 1) : nullptr,
               static_cast<int>(per_step * (kSeqLen + 1)), MPI_INT32_T, 0, MPI_COMM_WORLD);
    MPI_Gather(my_ids.data() + s * per_step, static_cast<int>(per_step), MPI_UINT64_T,
               rank == 0 ? all_ids.data() + s * 8 : nullptr, static_cast<int>(per_step),
               MPI_UINT64_T, 0, MPI_COMM_WORLD);
  }
  if (rank != 0) return;
  // The serial reference: one process, no prefetching, the global batches of the same
  // sampler positions (which do not depend on the number of ranks).
  const TokenDataset serial_ds = open_dataset(MPI_COMM_SELF, c.dir->str(), kSeqLen);
  SamplerConfig one = sc;
  one.dp_rank = 0;
  one.dp_size = 1;
  one.micro_batch_size = 8;
  Sampler ref(one);
  BatchReaderOptions no_prefetch;
  no_prefetch.prefetch = false;
  BatchReader serial(serial_ds, no_prefetch);
  std::vector<std::int32_t> expect;
  std::vector<std::uint64_t> expect_ids;
  for (int s = 0; s < steps; ++s) {
    const auto ids = ref.next_step().front();
    std::vector<std::uint64_t> sorted = ids;
    std::sort(sorted.begin(), sorted.end());
    ASSERT_EQ(std::adjacent_find(sorted.begin(), sorted.end()), sorted.end());
    serial.request(ids);
    const Batch b = serial.wait();
    expect.insert(expect.end(), b.tokens.begin(), b.tokens.end());
    expect_ids.insert(expect_ids.end(), ids.begin(), ids.end());
    for (std::size_t r = 0; r < b.rows(); ++r)
      ASSERT_EQ(row(b, r), expected_sample(c, ids[r]));
  }
  EXPECT_EQ(all_ids, expect_ids);
  EXPECT_EQ(all, expect);
}

// The global sample sequence for 1, 2 and 4 ranks: each run compares its gathered
// per-rank blocks with the rank-independent global batches, and with a pinned prefix so
// that the three runs are known to agree with each other.
TEST(Sampler, SameGlobalSequenceAtEveryRankCount) {
  const int size = world_size(), rank = world_rank();
  SamplerConfig sc;
  sc.num_samples = 1001;
  sc.seed = 77;
  sc.global_batch_size = 16;
  sc.micro_batch_size = 2;
  sc.dp_rank = rank;
  sc.dp_size = size;
  Sampler s(sc);
  SamplerConfig one = sc;
  one.dp_rank = 0;
  one.dp_size = 1;
  const Sampler ref(one);
  std::uint64_t prefix_hash = 1469598103934665603ULL;
  for (int step = 0; step < 130; ++step) {  // 2 epochs of 62 steps, and some
    const SamplePosition pos = s.position();
    std::vector<std::uint64_t> block;
    for (const auto& mb : s.next_step())
      block.insert(block.end(), mb.begin(), mb.end());
    std::vector<std::uint64_t> gathered(rank == 0 ? 16 : 0);
    MPI_Gather(block.data(), static_cast<int>(block.size()), MPI_UINT64_T, gathered.data(),
               static_cast<int>(block.size()), MPI_UINT64_T, 0, MPI_COMM_WORLD);
    if (rank == 0) {
      ASSERT_EQ(gathered, ref.global_batch(pos)) << "step " << step;
      for (const auto id : gathered)
        prefix_hash = (prefix_hash ^ id) * 1099511628211ULL;
    }
  }
  // Hash of the 130 x 16 ids in order, the same for every rank count (FNV-1a over ids).
  if (rank == 0) {
    EXPECT_EQ(prefix_hash, 10772937606001648141ULL) << prefix_hash;
  }
}

TEST(Dataset, LazyOpensAndBoundedOpenShards) {
  const Corpus c = make_corpus("mpi_lru");
  const TokenDataset ds = open_dataset(MPI_COMM_WORLD, c.dir->str(), kSeqLen);
  {
    BatchReader reader(ds);
    reader.request({0, 1, 2});  // all in shard a
    reader.wait();
    EXPECT_EQ(reader.stats().shard_opens, 1u);
  }
  BatchReaderOptions opt;
  opt.max_open_shards = 1;
  BatchReader reader(ds, opt);
  const std::uint64_t last = ds.num_samples() - 1;
  for (int k = 0; k < 3; ++k) {
    reader.request({0, last});  // alternates between a and c
    const Batch b = reader.wait();
    EXPECT_EQ(row(b, 1), expected_sample(c, last));
  }
  EXPECT_EQ(reader.stats().max_open, 1);
  EXPECT_EQ(reader.stats().shard_opens, 6u);
}

TEST(Dataset, ShardDisagreementIsReportedOnEveryRankByFileName) {
  std::string dir;
  std::unique_ptr<test::ScratchDir> owner;
  if (world_rank() == 0) {
    owner = std::make_unique<test::ScratchDir>("mpi_disagree");
    dir = owner->str();
    test::write_corpus_shard(owner->file("00.h5"), 0, 50);
    auto other = test::byte_options();
    other.tokenizer = {"bpe-32k", definition_hash("merges")};
    test::write_corpus_shard(owner->file("01.h5"), 50, 50, other);
  }
  unsigned long len = dir.size();
  MPI_Bcast(&len, 1, MPI_UNSIGNED_LONG, 0, MPI_COMM_WORLD);
  dir.resize(len);
  MPI_Bcast(dir.data(), static_cast<int>(len), MPI_CHAR, 0, MPI_COMM_WORLD);
  try {
    open_dataset(MPI_COMM_WORLD, dir, kSeqLen);
    FAIL() << "disagreeing shards accepted";
  } catch (const DatasetError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("01.h5"), std::string::npos) << m;
    EXPECT_NE(m.find("tokenizer_name 'bpe-32k'"), std::string::npos) << m;
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST(Dataset, UnfinishedShardIsNeverOpened) {
  const Corpus c = make_corpus("mpi_tmp");
  std::unique_ptr<ShardWriter> pending;
  if (world_rank() == 0) {
    pending = std::make_unique<ShardWriter>(c.dir->file("d.h5"), test::byte_options());
    pending->append_document({1, 2, 3});
  }
  MPI_Barrier(MPI_COMM_WORLD);
  const TokenDataset ds = open_dataset(MPI_COMM_WORLD, c.dir->str(), kSeqLen);
  EXPECT_EQ(ds.shards().size(), 4u);
  EXPECT_EQ(ds.num_tokens(), c.stream.size());
  EXPECT_THROW(open_dataset(MPI_COMM_WORLD, c.dir->file("d.h5.tmp"), kSeqLen), DatasetError);
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST(Dataset, ReadErrorsReachTheCaller) {
  const Corpus c = make_corpus("mpi_err");
  const TokenDataset ds = open_dataset(MPI_COMM_WORLD, c.dir->str(), kSeqLen);
  BatchReader reader(ds);
  EXPECT_THROW(reader.request({ds.num_samples()}), DatasetError);
  EXPECT_THROW(reader.wait(), Error);  // nothing outstanding
  // A token id beyond the vocabulary, planted after the dataset was opened (the header
  // check cannot see it): the read of that sample fails naming the shard; others work.
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) {
    h5::Lock lock;
    const hid_t f = H5Fopen(c.dir->file("c.h5").c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    const hid_t d = H5Dopen2(f, kTokensDataset, H5P_DEFAULT);
    const hid_t s = H5Dget_space(d);
    const hsize_t at[1] = {10}, one[1] = {1};
    H5Sselect_hyperslab(s, H5S_SELECT_SET, at, nullptr, one, nullptr);
    const hid_t m = H5Screate_simple(1, one, nullptr);
    const std::uint32_t v = 5000;
    H5Dwrite(d, H5T_NATIVE_UINT32, m, s, H5P_DEFAULT, &v);
    H5Sclose(m);
    H5Sclose(s);
    H5Dclose(d);
    H5Fclose(f);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  const std::uint64_t bad = (ds.shard_start(3) + 10) / kSeqLen;
  reader.request({0});
  reader.request({bad});
  reader.request({1});
  EXPECT_EQ(row(reader.wait(), 0), expected_sample(c, 0));
  try {
    reader.wait();
    ADD_FAILURE() << "an out-of-vocabulary id was read";
  } catch (const DatasetError& e) {
    EXPECT_NE(std::string(e.what()).find("c.h5"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("id 5000"), std::string::npos) << e.what();
  }
  EXPECT_EQ(row(reader.wait(), 0), expected_sample(c, 1));
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace
}  // namespace dst::data
