#include "comm/communicator.hpp"

#include <exception>
#include <string>

#include "core/error.hpp"
#include "core/log.hpp"

namespace dst::comm {

Request Communicator::ireduce_scatter_blocks(void*, const std::vector<std::size_t>&, DType,
                                             ReduceOp) {
  throw Error("comm: group '" + name() +
              "': this back end has no reduce-scatter of unequal blocks (parallel.zero_stage > 0 "
              "needs the mpi or shm back end)");
}

Request Communicator::iallgather_blocks(void*, const std::vector<std::size_t>&, DType) {
  throw Error("comm: group '" + name() +
              "': this back end has no all-gather of unequal blocks (parallel.zero_stage > 0 "
              "needs the mpi or shm back end)");
}

Request Communicator::isend(const void*, std::size_t, DType, int, int) {
  throw Error("comm: group '" + name() +
              "': this back end has no point-to-point send (parallel.pipeline > 1 needs the "
              "MPI back end for its stages)");
}

Request Communicator::irecv(void*, std::size_t, DType, int, int) {
  throw Error("comm: group '" + name() +
              "': this back end has no point-to-point receive (parallel.pipeline > 1 needs the "
              "MPI back end for its stages)");
}

Request Communicator::ialltoall(const void*, void*, std::size_t, DType) {
  throw Error("comm: group '" + name() +
              "': this back end has no all-to-all (parallel.expert > 1 needs the mpi back end)");
}

Request Communicator::ialltoallv(const void*, const std::vector<std::size_t>&, void*,
                                 const std::vector<std::size_t>&, DType) {
  throw Error("comm: group '" + name() +
              "': this back end has no all-to-all (parallel.expert > 1 needs the mpi back end)");
}

Request& Request::operator=(Request&& other) noexcept {
  if (this != &other) {
    // The collective held so far must be settled before it is forgotten, exactly as if
    // this request were destroyed.
    finish_noexcept();
    impl_ = std::move(other.impl_);
    wait_failed_ = other.wait_failed_;
    uncaught_at_start_ = other.uncaught_at_start_;
    other.wait_failed_ = false;
  }
  return *this;
}

Request::~Request() {
  finish_noexcept();
}

bool Request::test() {
  if (!impl_) return true;
  return impl_->test();
}

void Request::wait() {
  if (!impl_)
    throw Error("comm: wait() on an empty request (already waited, moved from or never started)");
  try {
    impl_->wait();
  } catch (...) {
    wait_failed_ = true;
    throw;
  }
  impl_.reset();
  wait_failed_ = false;
}

void Request::wait_for(double timeout_s) {
  if (!impl_)
    throw Error(
        "comm: wait_for() on an empty request (already waited, moved from or never started)");
  try {
    impl_->wait_for(timeout_s);
  } catch (...) {
    wait_failed_ = true;
    throw;
  }
  impl_.reset();
  wait_failed_ = false;
}

void Request::finish_noexcept() noexcept {
  if (!impl_) return;
  // See the rules in communicator.hpp: never wait twice past a deadline, never add a
  // deadline to an error already on its way to main, never throw.
  if (wait_failed_) {
    impl_.reset();  // forgets the pending MPI request; the job is being ended
    wait_failed_ = false;
    return;
  }
  if (std::uncaught_exceptions() > uncaught_at_start_) {
    try {
      log::warn(impl_->describe() +
                " was abandoned unfinished while an error propagates; it stays pending");
    } catch (...) {
      // Logging is best effort here; the propagating error is what matters.
    }
    impl_.reset();
    return;
  }
  try {
    impl_->wait();
    impl_.reset();
  } catch (const std::exception& e) {
    log::error(std::string("comm: a request destroyed without wait() failed to complete: ") +
               e.what() + "; terminating");
    std::terminate();
  } catch (...) {
    log::error("comm: a request destroyed without wait() failed to complete; terminating");
    std::terminate();
  }
}

}  // namespace dst::comm
