#include "runtime/cpu_binding.hpp"

#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "core/error.hpp"
#include "core/parallel.hpp"

namespace dst::runtime {
namespace {

TEST(CpuList, ParsesAndFormatsTheKernelsListFormat) {
  EXPECT_EQ(parse_cpu_list("0"), (CpuList{0}));
  EXPECT_EQ(parse_cpu_list("0-3,8\n"), (CpuList{0, 1, 2, 3, 8}));
  EXPECT_EQ(parse_cpu_list("8,0-1,1"), (CpuList{0, 1, 8}));
  EXPECT_EQ(format_cpu_list({0, 1, 2, 3, 8}), "0-3,8");
  EXPECT_EQ(format_cpu_list({5}), "5");
  EXPECT_EQ(format_cpu_list({0, 2, 3}), "0,2-3");
  EXPECT_EQ(format_cpu_list({}), "");
  for (const char* bad : {"", "a", "1-", "3-1", "1,,2", "1;2", "-1"})
    EXPECT_THROW(parse_cpu_list(bad), Error) << "'" << bad << "'";
}

TEST(CpuList, OwnCpusIsThisProcesssMask) {
  const CpuList mine = core::affinity_cpus();
  ASSERT_FALSE(mine.empty());
  std::ifstream status("/proc/self/status");
  std::string line;
  std::string listed;
  while (std::getline(status, line))
    if (line.rfind("Cpus_allowed_list:", 0) == 0) listed = line.substr(line.find(':') + 1);
  while (!listed.empty() && (listed.front() == '\t' || listed.front() == ' '))
    listed.erase(0, 1);
  EXPECT_EQ(mine, parse_cpu_list(listed));
}

CpuClaim rank(int r, CpuList cpus) {
  return {r, 1000 + r, std::move(cpus)};
}

TEST(Crowding, NoneWhenEveryRankHasACpu) {
  EXPECT_FALSE(find_crowding({rank(0, {0}), rank(1, {1})}));
  EXPECT_FALSE(find_crowding({rank(0, {0, 1}), rank(1, {0, 1})}));  // unbound, 2 on 2
  EXPECT_FALSE(find_crowding({rank(0, {0, 1}), {-1, 7, {0}}}));     // we can move to 1
  EXPECT_FALSE(find_crowding({rank(0, {0}), rank(1, {})}));         // unknown: not counted
  EXPECT_FALSE(find_crowding({}));
}

TEST(Crowding, TwoRanksBoundToOneCore) {
  const auto c = find_crowding({rank(0, {0}), rank(1, {0}), rank(2, {1})});
  ASSERT_TRUE(c);
  EXPECT_EQ(c->cpus, (CpuList{0}));
  ASSERT_EQ(c->claims.size(), 2u);
  EXPECT_EQ(describe_crowding(*c, "node7"),
            "cpus: 2 processes share CPU 0 of node7 (1 CPU): ranks 0-1; each computes at about "
            "1/2 of a CPU's speed. Run at most one rank per CPU, or bind the ranks to distinct "
            "cores (mpirun --bind-to core)");
}

TEST(Crowding, MoreUnboundRanksThanCpus) {
  const auto c =
      find_crowding({rank(0, {0, 1}), rank(1, {0, 1}), rank(2, {0, 1}), rank(3, {0, 1})});
  ASSERT_TRUE(c);
  EXPECT_EQ(c->cpus, (CpuList{0, 1}));
  EXPECT_EQ(c->claims.size(), 4u);
  EXPECT_NE(describe_crowding(*c, "h").find("4 processes share CPUs 0-1 of h (2 CPUs): ranks 0-3; "
                                            "each computes at about 1/2 of a CPU's speed"),
            std::string::npos);
}

TEST(Crowding, AnotherJobOnTheSameCore) {
  // Two one-rank mpirun jobs: Open MPI binds each job's rank 0 to core 0.
  const auto c = find_crowding({rank(0, {0}), {-1, 4242, {0}}});
  ASSERT_TRUE(c);
  EXPECT_EQ(describe_crowding(*c, "h"),
            "cpus: 2 processes share CPU 0 of h (1 CPU): rank 0 of this job and dstrain pid 4242 "
            "(not of this job); each computes at about 1/2 of a CPU's speed. Open MPI binds "
            "every job's ranks from the first core up: give concurrent jobs disjoint CPUs "
            "(mpirun --cpu-set, or srun), or launch with --bind-to none");
  // Unbound ranks of this job crowded by another job's process bound inside their CPUs.
  EXPECT_TRUE(find_crowding({rank(0, {0, 1}), rank(1, {0, 1}), {-1, 9, {1}}}));
}

TEST(Crowding, ReportsTheMostCrowdedSetAndNamesAFewOthers) {
  std::vector<CpuClaim> claims{rank(0, {0, 1}), rank(1, {0, 1}), rank(2, {0, 1})};  // 3 on 2
  for (int p = 0; p < 6; ++p)
    claims.push_back({-1, 100 + p, {2}});  // 6 on 1
  const auto c = find_crowding(claims);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->cpus, (CpuList{2}));
  EXPECT_NE(describe_crowding(*c, "h").find(
                "6 processes share CPU 2 of h (1 CPU): dstrain pids 100, 101, 102, 103 and 2 more "
                "(not of this job)"),
            std::string::npos);
}

/// A process whose name is "dstrain" (a symbolic link to sleep), confined to one CPU.
class FakeDstrain {
 public:
  explicit FakeDstrain(int cpu) {
    dir_ = std::filesystem::temp_directory_path() / ("dst_cpu_binding_" + std::to_string(getpid()));
    std::filesystem::create_directories(dir_);
    const auto link = dir_ / "dstrain";
    std::filesystem::remove(link);
    std::filesystem::create_symlink("/bin/sleep", link);
    pid_ = fork();
    if (pid_ < 0) return;  // the test's ASSERT on comm() reports it
    if (pid_ == 0) {
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(cpu, &set);
      sched_setaffinity(0, sizeof set, &set);
      execl(link.c_str(), "dstrain", "60", static_cast<char*>(nullptr));
      _exit(127);
    }
    // Until the exec has renamed the child.
    for (int i = 0; i < 500 && comm() != "dstrain\n"; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ~FakeDstrain() {
    if (pid_ > 0) {  // never kill(-1): that signals every process we may signal
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    std::filesystem::remove_all(dir_);
  }
  int pid() const { return pid_; }
  std::string comm() const {
    std::ifstream in("/proc/" + std::to_string(pid_) + "/comm");
    std::string s;
    std::getline(in, s);
    return in ? s + "\n" : std::string();
  }

 private:
  std::filesystem::path dir_;
  int pid_ = -1;
};

const CpuClaim* find_pid(const std::vector<CpuClaim>& v, int pid) {
  const auto it = std::find_if(v.begin(), v.end(), [&](const CpuClaim& c) { return c.pid == pid; });
  return it == v.end() ? nullptr : &*it;
}

TEST(OtherDstrainProcesses, FindsALiveOneWithItsCpusUnlessExcludedOrStopped) {
  const int cpu = core::affinity_cpus().back();
  FakeDstrain other(cpu);
  ASSERT_EQ(other.comm(), "dstrain\n");
  const auto found = other_dstrain_processes({});
  const CpuClaim* c = find_pid(found, other.pid());
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->rank, -1);
  EXPECT_EQ(c->cpus, (CpuList{cpu}));
  EXPECT_EQ(find_pid(other_dstrain_processes({other.pid()}), other.pid()), nullptr);
  ASSERT_EQ(kill(other.pid(), SIGSTOP), 0);
  int status = 0;
  ASSERT_EQ(waitpid(other.pid(), &status, WUNTRACED), other.pid());
  EXPECT_EQ(find_pid(other_dstrain_processes({}), other.pid()), nullptr);  // not computing
  // This test program is not named dstrain: never listed.
  EXPECT_EQ(find_pid(other_dstrain_processes({}), getpid()), nullptr);
}

}  // namespace
}  // namespace dst::runtime
