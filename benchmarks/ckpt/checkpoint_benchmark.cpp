// Checkpoint throughput against the plain sequential I/O of the same bytes on the same
// file system (docs/checkpoint.md, "throughput").
//
//   mpiexec -n N checkpoint_benchmark --dir DIR [--mb 1024] [--reps 3] [--alignment BYTES]
//                                      [--hint KEY=VALUE]... [--label TEXT]
//
// Tensors: layers of one (4096, 1024) f32 matrix (16 MiB) and one (4096) vector, as many
// as make --mb megabytes (1e6 bytes), identical on every rank. Each repetition measures:
//   plain write   rank 0 writes the same bytes to one file with write(2) in 8 MiB pieces,
//                 then fsync: the sequential baseline
//   plain read    rank 0 drops that file from the page cache (fsync'd pages are clean, so
//                 posix_fadvise DONTNEED evicts them) and reads it back
//   ckpt write    Directory::save: IoStats.seconds (collective create, write, close, fsync)
//   ckpt save     IoStats.total_seconds: + checksums, whole-file hash, commit
//   ckpt read     the checkpoint dropped from the page cache, then Reader: IoStats.seconds
//                 (collective reads + exchange between ranks); the manifest's whole-file
//                 hash reads the file first, so these reads come from the page cache
//   ckpt load     everything from the cold file: manifest hash + open + reads + checksums
// Rank 0 prints one line per repetition and a final line of medians (GB/s = 1e9 B/s).
#include <fcntl.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "ckpt/checkpoint.hpp"
#include "core/log.hpp"

namespace {

using namespace dst::ckpt;
using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

struct Options {
  std::string dir, label = "default";
  double mb = 1024;
  int reps = 3;
  IoOptions io;
};

void drop_from_cache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

void check(bool ok, const char* what) {
  if (!ok) {
    std::perror(what);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
}

double plain_write(const std::string& path, const std::vector<TensorRef>& ts) {
  const auto t0 = Clock::now();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  check(fd >= 0, "plain write: open");
  for (const auto& t : ts) {
    std::uint64_t n = 1;
    for (auto d : t.shape)
      n *= static_cast<std::uint64_t>(d);
    const char* p = reinterpret_cast<const char*>(t.data);
    for (std::uint64_t done = 0, bytes = n * 4; done < bytes;) {
      const ssize_t w = ::write(fd, p + done, std::min<std::uint64_t>(bytes - done, 8 << 20));
      check(w > 0, "plain write: write");
      done += static_cast<std::uint64_t>(w);
    }
  }
  check(::fsync(fd) == 0, "plain write: fsync");
  ::close(fd);
  return since(t0);
}

double plain_read(const std::string& path, std::vector<char>& buf) {
  drop_from_cache(path);
  const auto t0 = Clock::now();
  const int fd = ::open(path.c_str(), O_RDONLY);
  check(fd >= 0, "plain read: open");
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  for (;;) {
    const ssize_t r = ::read(fd, buf.data(), buf.size());
    check(r >= 0, "plain read: read");
    if (r == 0) break;
  }
  ::close(fd);
  return since(t0);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  dst::log::set_rank(rank);
  dst::log::set_level(dst::log::Level::warn);  // no "pruned" lines between the figures

  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--dir")
      o.dir = v;
    else if (k == "--mb")
      o.mb = std::stod(v);
    else if (k == "--reps")
      o.reps = std::stoi(v);
    else if (k == "--alignment")
      o.io.alignment = std::stoull(v);
    else if (k == "--label")
      o.label = v;
    else if (k == "--hint" && v.find('=') != std::string::npos)
      o.io.mpi_hints.emplace_back(v.substr(0, v.find('=')), v.substr(v.find('=') + 1));
    else {
      if (rank == 0)
        std::fprintf(stderr, "checkpoint_benchmark: bad argument %s %s\n", k.c_str(), v.c_str());
      MPI_Finalize();
      return 2;
    }
  }
  if (o.dir.empty()) {
    if (rank == 0) std::fprintf(stderr, "usage: checkpoint_benchmark --dir DIR [--mb MB] ...\n");
    MPI_Finalize();
    return 2;
  }

  // (4096, 1024) + (4096) per layer: 16.8 MB.
  const std::int64_t rows = 4096, cols = 1024;
  const auto layers = static_cast<std::int64_t>(
      std::max(1.0, o.mb * 1e6 / (static_cast<double>(rows * cols + rows) * 4) + 0.5));
  std::vector<std::vector<float>> store;
  std::vector<TensorRef> ts;
  std::uint64_t bytes = 0, largest = 0;
  for (std::int64_t l = 0; l < layers; ++l) {
    for (const auto& shape :
         {std::vector<std::int64_t>{rows, cols}, std::vector<std::int64_t>{rows}}) {
      const std::uint64_t n = shape.size() == 2 ? rows * cols : rows;
      store.emplace_back(n);
      for (std::uint64_t i = 0; i < n; ++i)
        store.back()[i] = static_cast<float>((i * 7 + l) % 977) * 1e-3f;
      ts.push_back({"params/model.layers." + std::to_string(l) +
                        (shape.size() == 2 ? ".mlp.up_proj.weight" : ".input_layernorm.weight"),
                    shape, store.back().data()});
      bytes += n * 4;
      largest = std::max(largest, n);
    }
  }
  const std::string ckdir = o.dir + "/ckpt", plain = o.dir + "/plain.bin";
  if (rank == 0) std::filesystem::create_directories(ckdir);
  std::vector<char> rbuf(8 << 20);
  std::vector<float> tbuf(largest);
  std::vector<double> pw, pr, cw, cs, cr, cl;
  int collective = 1;
  if (rank == 0)
    std::printf(
        "checkpoint_benchmark: %s, %d rank(s), %.3f GB of tensors (%lld layers), "
        "alignment %llu\n",
        o.label.c_str(), size, bytes / 1e9, static_cast<long long>(layers),
        static_cast<unsigned long long>(o.io.alignment));
  Directory dir(MPI_COMM_WORLD, ckdir, 600);
  dir.set_io_options(o.io);
  for (int rep = 0; rep < o.reps; ++rep) {
    if (rank == 0) {
      pw.push_back(bytes / plain_write(plain, ts) / 1e9);
      pr.push_back(bytes / plain_read(plain, rbuf) / 1e9);
      std::filesystem::remove(plain);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    Metadata meta;
    meta.step = rep + 1;
    const IoStats s = dir.save(meta, ts, 1);
    collective &= s.collective ? 1 : 0;
    cw.push_back(bytes / s.seconds / 1e9);
    cs.push_back(bytes / s.total_seconds / 1e9);
    if (rank == 0) drop_from_cache(s.path);
    MPI_Barrier(MPI_COMM_WORLD);
    const auto t0 = Clock::now();
    {
      Reader r(MPI_COMM_WORLD, s.path, 600, o.io);
      for (const auto& t : ts)
        r.read(t.name, t.shape, tbuf.data());
      double load_s = since(t0);
      MPI_Allreduce(MPI_IN_PLACE, &load_s, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      double read_s = r.stats().seconds;
      MPI_Allreduce(MPI_IN_PLACE, &read_s, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      cr.push_back(bytes / read_s / 1e9);
      cl.push_back(bytes / load_s / 1e9);
      collective &= r.stats().collective ? 1 : 0;
    }
    if (rank == 0)
      std::printf(
          "rep %d: plain write %.3f  ckpt write %.3f  ckpt save %.3f  plain read %.3f  "
          "ckpt read %.3f  ckpt load %.3f GB/s\n",
          rep + 1, pw.back(), cw.back(), cs.back(), pr.back(), cr.back(), cl.back());
  }
  MPI_Allreduce(MPI_IN_PLACE, &collective, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (rank == 0) {
    std::printf(
        "median (%d reps) | %s | ranks %d | plain write %.3f | ckpt write %.3f (%.0f%%) | "
        "ckpt save %.3f (%.0f%%) | plain read %.3f | ckpt read %.3f | ckpt load %.3f "
        "(%.0f%%) | collective %d\n",
        o.reps, o.label.c_str(), size, median(pw), median(cw), 100 * median(cw) / median(pw),
        median(cs), 100 * median(cs) / median(pw), median(pr), median(cr), median(cl),
        100 * median(cl) / median(pr), collective);
    std::filesystem::remove_all(ckdir);
  }
  MPI_Finalize();
  return collective ? 0 : 1;
}
