#include "runtime/mpi_collectives.hpp"

#include <climits>
#include <exception>

#include "core/error.hpp"
#include "runtime/mpi_check.hpp"
#include "runtime/mpi_wait.hpp"

namespace dst::runtime {

namespace {

int checked_count(std::uint64_t n, const std::string& what) {
  DST_REQUIRE(n <= static_cast<std::uint64_t>(INT_MAX),
              what << ": " << n << " elements exceed MPI's int count");
  return static_cast<int>(n);
}

}  // namespace

RootResult attempt(const std::function<std::string()>& produce) {
  try {
    return {true, produce()};
  } catch (const std::exception& e) {
    return {false, e.what()};
  }
}

MpiCollectives::MpiCollectives(MPI_Comm comm, double timeout_s, Describe describe)
    : comm_(comm), timeout_s_(timeout_s), describe_(std::move(describe)) {
  DST_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  DST_MPI_CHECK(MPI_Comm_size(comm_, &size_));
}

void MpiCollectives::wait(MPI_Request& request, const std::string& name) {
  wait_with_deadline(request, timeout_s_, [&] { return describe_(name); });
}

void MpiCollectives::allreduce(void* values, int count, MPI_Datatype type, MPI_Op op,
                               const std::string& name) {
  MPI_Request r = MPI_REQUEST_NULL;
  DST_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, values, count, type, op, comm_, &r));
  wait(r, name);
}

void MpiCollectives::broadcast(void* values, int count, MPI_Datatype type, int root,
                               const std::string& name) {
  MPI_Request r = MPI_REQUEST_NULL;
  DST_MPI_CHECK(MPI_Ibcast(values, count, type, root, comm_, &r));
  wait(r, name);
}

void MpiCollectives::broadcast(std::string& text, int root, const std::string& name) {
  std::uint64_t n = text.size();
  broadcast(&n, 1, MPI_UINT64_T, root, name);
  text.resize(n);
  if (n > 0) broadcast(text.data(), checked_count(n, describe_(name)), MPI_CHAR, root, name);
}

void MpiCollectives::gather(const void* send, int count, MPI_Datatype type, void* recv, int root,
                            const std::string& name) {
  MPI_Request r = MPI_REQUEST_NULL;
  DST_MPI_CHECK(MPI_Igather(send, count, type, recv, count, type, root, comm_, &r));
  wait(r, name);
}

void MpiCollectives::gatherv(const void* send, int count, MPI_Datatype type, void* recv,
                             const int* counts, const int* displs, int root,
                             const std::string& name) {
  MPI_Request r = MPI_REQUEST_NULL;
  DST_MPI_CHECK(MPI_Igatherv(send, count, type, recv, counts, displs, type, root, comm_, &r));
  wait(r, name);
}

std::vector<std::uint64_t> MpiCollectives::allgather_u64(const std::vector<std::uint64_t>& mine,
                                                         const std::string& name) {
  std::vector<std::uint64_t> counts(static_cast<std::size_t>(size_));
  std::uint64_t n = mine.size();
  {
    MPI_Request r = MPI_REQUEST_NULL;
    DST_MPI_CHECK(MPI_Iallgather(&n, 1, MPI_UINT64_T, counts.data(), 1, MPI_UINT64_T, comm_, &r));
    wait(r, name);
  }
  std::vector<int> icounts(counts.size()), displs(counts.size());
  std::uint64_t total = 0;
  for (std::size_t i = 0; i < counts.size(); ++i) {
    icounts[i] = checked_count(counts[i], describe_(name));
    displs[i] = checked_count(total, describe_(name));
    total += counts[i];
  }
  std::vector<std::uint64_t> all(total);
  MPI_Request r = MPI_REQUEST_NULL;
  DST_MPI_CHECK(MPI_Iallgatherv(mine.data(), static_cast<int>(n), MPI_UINT64_T, all.data(),
                                icounts.data(), displs.data(), MPI_UINT64_T, comm_, &r));
  wait(r, name + "v");
  return all;
}

void MpiCollectives::exchange_pieces(float* data, const std::vector<std::uint64_t>& offsets,
                                     const std::vector<std::uint64_t>& counts,
                                     const std::string& name) {
  std::vector<MPI_Request> requests;
  requests.reserve(static_cast<std::size_t>(size_));
  for (int root = 0; root < size_; ++root) {
    if (counts[root] == 0) continue;
    const int n = checked_count(counts[root], describe_(name));
    requests.emplace_back(MPI_REQUEST_NULL);
    DST_MPI_CHECK(MPI_Ibcast(data + offsets[root], n, MPI_FLOAT, root, comm_, &requests.back()));
  }
  for (auto& r : requests)
    wait(r, name);
}

std::optional<Failure> MpiCollectives::first_failure(const std::optional<std::string>& mine,
                                                     const std::string& name) {
  int first = mine ? rank_ : size_;
  allreduce(&first, 1, MPI_INT, MPI_MIN, name);
  if (first == size_) return std::nullopt;
  Failure f{first, rank_ == first ? *mine : std::string()};
  broadcast(f.message, first, name);
  return f;
}

int MpiCollectives::count_failed(bool failed, const std::string& name) {
  int n = failed ? 1 : 0;
  allreduce(&n, 1, MPI_INT, MPI_SUM, name);
  return n;
}

RootResult MpiCollectives::broadcast_result(const RootResult& mine, int root,
                                            const std::string& name) {
  RootResult out;
  if (rank_ == root) {
    out = mine;
    if (out.text.size() > static_cast<std::size_t>(INT_MAX))
      out = {false, describe_(name) + ": " + std::to_string(mine.text.size()) +
                        " B are more than one broadcast carries"};
  }
  // (2,) ok, length in bytes
  std::uint64_t header[2] = {out.ok ? 1u : 0u, out.text.size()};
  broadcast(header, 2, MPI_UINT64_T, root, name + " (header)");
  out.ok = header[0] != 0;
  out.text.resize(header[1]);
  if (header[1] > 0) {
    broadcast(out.text.data(), static_cast<int>(header[1]), MPI_CHAR, root,
              name + " (" + std::to_string(header[1]) + " B)");
  }
  return out;
}

}  // namespace dst::runtime
