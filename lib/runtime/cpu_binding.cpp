#include "runtime/cpu_binding.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>

#include "core/error.hpp"

namespace dst::runtime {

namespace {

/// Reads /proc/<pid>/<name> whole; empty when the process is gone or unreadable.
std::string read_proc(const std::string& pid, const char* name) {
  std::ifstream in("/proc/" + pid + "/" + name);
  std::ostringstream s;
  s << in.rdbuf();
  return in ? s.str() : std::string();
}

/// The value of a `Key:\tvalue` line of /proc/<pid>/status, without the newline.
std::string status_field(const std::string& status, const std::string& key) {
  const std::string tag = "\n" + key + ":";
  const auto at = status.find(tag);
  if (at == std::string::npos) return {};
  auto begin = at + tag.size();
  while (begin < status.size() && (status[begin] == '\t' || status[begin] == ' '))
    ++begin;
  return status.substr(begin, status.find('\n', begin) - begin);
}

/// "ranks 0-3" / "rank 2" / "dstrain pid 4242" pieces, joined "a, b and c".
std::string join_names(const std::vector<std::string>& names) {
  std::string s;
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (i > 0) s += i + 1 == names.size() ? " and " : ", ";
    s += names[i];
  }
  return s;
}

}  // namespace

CpuList parse_cpu_list(const std::string_view text) {
  auto bad = [&](const std::string& why) {
    return Error("CPU list '" + std::string(text) + "': " + why +
                 " (expected the kernel's list format, e.g. 0-3,8)");
  };
  std::string_view s = text;
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back())))
    s.remove_suffix(1);
  if (s.empty()) throw bad("empty");
  CpuList cpus;
  auto number = [&](std::string_view& rest) {
    int v = -1;
    const auto r = std::from_chars(rest.data(), rest.data() + rest.size(), v);
    if (r.ec != std::errc() || v < 0) throw bad("not a CPU number");
    rest.remove_prefix(static_cast<std::size_t>(r.ptr - rest.data()));
    return v;
  };
  while (true) {
    const int first = number(s);
    int last = first;
    if (!s.empty() && s.front() == '-') {
      s.remove_prefix(1);
      last = number(s);
      if (last < first) throw bad("descending range");
      if (last - first > (1 << 20)) throw bad("range too long");
    }
    for (int c = first; c <= last; ++c)
      cpus.push_back(c);
    if (s.empty()) break;
    if (s.front() != ',') throw bad("unexpected '" + std::string(1, s.front()) + "'");
    s.remove_prefix(1);
  }
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  return cpus;
}

std::string format_cpu_list(const CpuList& cpus) {
  std::string s;
  for (std::size_t i = 0; i < cpus.size();) {
    std::size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1)
      ++j;
    if (!s.empty()) s += ',';
    s += std::to_string(cpus[i]);
    if (j > i) s += '-' + std::to_string(cpus[j]);
    i = j + 1;
  }
  return s;
}

std::optional<Crowding> find_crowding(const std::vector<CpuClaim>& claims) {
  std::optional<Crowding> worst;
  double worst_load = 1.0;  // processes per CPU; above 1 is crowded
  for (const auto& candidate : claims) {
    const CpuList& set = candidate.cpus;
    if (set.empty()) continue;
    Crowding c{set, {}};
    for (const auto& other : claims)
      if (!other.cpus.empty() &&
          std::includes(set.begin(), set.end(), other.cpus.begin(), other.cpus.end()))
        c.claims.push_back(other);
    const double load = static_cast<double>(c.claims.size()) / static_cast<double>(set.size());
    if (load > worst_load) {
      worst_load = load;
      worst = std::move(c);
    }
  }
  return worst;
}

std::vector<CpuClaim> other_dstrain_processes(const std::vector<int>& exclude) {
  std::vector<CpuClaim> found;
  std::error_code ec;  // no /proc, or an error while reading it: what was read so far
  for (std::filesystem::directory_iterator it("/proc", ec), end; !ec && it != end;
       it.increment(ec)) {
    const std::string pid = it->path().filename().string();
    if (pid.empty() || !std::all_of(pid.begin(), pid.end(),
                                    [](unsigned char ch) { return std::isdigit(ch) != 0; }))
      continue;
    const int id = std::stoi(pid);
    if (std::find(exclude.begin(), exclude.end(), id) != exclude.end()) continue;
    if (read_proc(pid, "comm") != "dstrain\n") continue;
    const std::string status = read_proc(pid, "status");
    const std::string state = status_field(status, "State");
    // Z zombie, X dead, T/t stopped: not computing.
    if (state.empty() || std::string("ZXTt").find(state[0]) != std::string::npos) continue;
    try {
      found.push_back({-1, id, parse_cpu_list(status_field(status, "Cpus_allowed_list"))});
    } catch (const Error&) {
      // A kernel without the field, or a process gone mid-read: not counted.
    }
  }
  return found;
}

std::string describe_crowding(const Crowding& c, const std::string& host) {
  CpuList ranks;
  std::vector<std::string> pids;
  for (const auto& claim : c.claims) {
    if (claim.rank >= 0)
      ranks.push_back(claim.rank);
    else
      pids.push_back(std::to_string(claim.pid));
  }
  std::sort(ranks.begin(), ranks.end());
  const bool other_jobs = !pids.empty();
  std::vector<std::string> names;
  if (!ranks.empty())
    names.push_back((ranks.size() == 1 ? "rank " : "ranks ") + format_cpu_list(ranks) +
                    (other_jobs ? " of this job" : ""));
  if (other_jobs) {
    constexpr std::size_t kNamed = 4;  // a line, not a process table
    const std::size_t more = pids.size() > kNamed ? pids.size() - kNamed : 0;
    const std::string which = pids.size() == 1 ? "dstrain pid " : "dstrain pids ";
    pids.resize(std::min(pids.size(), kNamed));
    if (more > 0) pids.push_back(std::to_string(more) + " more");
    names.push_back(which + join_names(pids) + " (not of this job)");
  }
  const std::size_t n = c.claims.size();
  const std::size_t k = c.cpus.size();
  const std::size_t g = std::gcd(n, k);
  std::string s = "cpus: " + std::to_string(n) + " processes share " + (k == 1 ? "CPU " : "CPUs ") +
                  format_cpu_list(c.cpus) + " of " + host + " (" + std::to_string(k) +
                  (k == 1 ? " CPU" : " CPUs") + "): " + join_names(names) +
                  "; each computes at about " + std::to_string(k / g) + "/" +
                  std::to_string(n / g) + " of a CPU's speed. ";
  if (other_jobs)
    s += "Open MPI binds every job's ranks from the first core up: give concurrent jobs "
         "disjoint CPUs (mpirun --cpu-set, or srun), or launch with --bind-to none";
  else
    s += "Run at most one rank per CPU, or bind the ranks to distinct cores (mpirun --bind-to "
         "core)";
  return s;
}

}  // namespace dst::runtime
