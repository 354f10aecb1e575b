#pragma once
/// \file cpu_binding.hpp
/// Whether the processes computing on this node have a CPU each. Open MPI binds every
/// job's ranks from the first core up, whatever the launching shell's CPU mask: two
/// `mpirun` jobs started on one node, or a `--oversubscribe`d one, put several ranks on
/// one core, and each then computes at a fraction of its speed without any error. At
/// start-up the node's ranks compare their affinity masks with each other's and with
/// those of the other dstrain processes on the machine, and the job warns once per node.

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dst::runtime {

/// CPU numbers, ascending and distinct (this process's own: core::affinity_cpus()).
using CpuList = std::vector<int>;

/// The kernel's list format ("0-3,8", as /proc/<pid>/status `Cpus_allowed_list` and
/// taskset -c write it). parse_cpu_list throws dst::Error on anything else.
CpuList parse_cpu_list(std::string_view text);
std::string format_cpu_list(const CpuList& cpus);

/// A process computing on this machine and the CPUs it may run on.
struct CpuClaim {
  int rank = -1;  ///< world rank in this job; -1 for a process of another job
  int pid = 0;
  CpuList cpus;  ///< empty: unknown (never counted)
};

/// CPUs to which more processes are confined than there are CPUs.
struct Crowding {
  CpuList cpus;
  std::vector<CpuClaim> claims;  ///< the processes whose CPUs all lie in `cpus`
};

/// The most crowded of the claims' CPU sets (processes per CPU; the first found among
/// equals), or nothing when each set holds at least as many CPUs as the processes
/// confined to it. A process allowed on more CPUs than that set counts only where all
/// its CPUs are: the scheduler can move it to the others.
std::optional<Crowding> find_crowding(const std::vector<CpuClaim>& claims);

/// The live dstrain processes of this machine (`/proc/<pid>/comm` "dstrain", not a
/// zombie or stopped) other than those in `exclude`, with their CPUs. Processes that end
/// while being read are left out.
std::vector<CpuClaim> other_dstrain_processes(const std::vector<int>& exclude);

/// One warning line for `c` on `host`: who shares which CPUs, what it costs, what to do.
std::string describe_crowding(const Crowding& c, const std::string& host);

}  // namespace dst::runtime
