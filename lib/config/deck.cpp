#include "config/deck.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <fstream>
#include <initializer_list>
#include <map>
#include <optional>
#include <set>
#include <type_traits>
#include <utility>

#include "config/scalar.hpp"
#include "config/schema.hpp"
#include "config/yaml_tree.hpp"
#include "core/error.hpp"
#include "core/suggest.hpp"

namespace dst::config {

namespace detail {
namespace {

/// Where each explicitly given key came from ("deck.yaml:3:5" or "--set ..."); keys
/// absent here took their default (or preset) value.
using GivenKeys = std::map<std::string, std::string>;

std::string join(const std::vector<const char*>& items, const char* sep) {
  std::string out;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += sep;
    out += items[i];
  }
  return out;
}

// ---------------------------------------------------------------------------------------
// Reading one value from a node (types only; ranges are checked on the config)
// ---------------------------------------------------------------------------------------

[[noreturn]] void fail(const std::string& key, const YamlNode& node, const std::string& message) {
  throw DeckError(key, node.where, message);
}

std::string got(const YamlNode& node) {
  if (node.kind == YamlNode::Kind::Scalar && !node.plain)
    return "the quoted string " + describe(node);
  return describe(node);
}

std::int64_t read_int(const YamlNode& node, const std::string& key, bool allow_auto) {
  const char* expected =
      allow_auto ? "expected an integer or auto, got " : "expected an integer, got ";
  if (node.kind != YamlNode::Kind::Scalar || !node.plain) fail(key, node, expected + got(node));
  if (allow_auto && node.value == "auto") return 0;
  if (core_int_syntax(node.value)) {
    if (const std::optional<std::int64_t> v = parse_core_int(node.value)) return *v;
    fail(key, node, "integer " + describe(node) + " is out of range");
  }
  if (core_float_syntax(node.value))
    fail(key, node, expected + node.value + " (a number with a fraction or exponent)");
  fail(key, node, expected + got(node));
}

double read_number(const YamlNode& node, const std::string& key) {
  if (node.kind != YamlNode::Kind::Scalar || !node.plain)
    fail(key, node, "expected a number, got " + got(node));
  const std::optional<CoreNumber> v = parse_core_number(node.value);
  if (!v) fail(key, node, "expected a number, got " + got(node));
  if (v->out_of_range) fail(key, node, "number " + describe(node) + " is out of range");
  if (!v->finite) fail(key, node, "must be a finite number, got " + node.value);
  return v->value;
}

void read_value(const YamlNode& node, const std::string& key, const Spec& spec, std::int64_t& out) {
  out = read_int(node, key, spec.auto_zero);
}

void read_value(const YamlNode& node, const std::string& key, const Spec&, std::uint64_t& out) {
  if (node.kind != YamlNode::Kind::Scalar || !node.plain || !core_int_syntax(node.value)) {
    read_int(node, key, false);  // throws the typed message
    fail(key, node, "expected an integer, got " + got(node));
  }
  if (const std::optional<std::uint64_t> v = parse_core_uint(node.value)) {
    out = *v;
    return;
  }
  if (node.value[0] == '-') fail(key, node, "must be >= 0, got " + node.value);
  fail(key, node, "integer " + describe(node) + " is out of range");
}

void read_value(const YamlNode& node, const std::string& key, const Spec&, double& out) {
  out = read_number(node, key);
}

void read_value(const YamlNode& node, const std::string& key, const Spec&, bool& out) {
  if (node.kind == YamlNode::Kind::Scalar && node.plain) {
    if (const std::optional<bool> v = parse_core_bool(node.value)) {
      out = *v;
      return;
    }
  }
  fail(key, node, "expected a boolean (true or false), got " + got(node));
}

void read_value(const YamlNode& node, const std::string& key, const Spec& spec, std::string& out) {
  if (node.kind == YamlNode::Kind::Scalar) {
    out = node.value;
    return;
  }
  if (node.kind == YamlNode::Kind::Null && spec.allow_empty) {
    out.clear();
    return;
  }
  if (!spec.choices.empty())
    fail(key, node, "expected one of " + join(spec.choices, ", ") + ", got " + got(node));
  fail(key, node, "expected a string, got " + got(node));
}

/// An enumerated setting: one of its names (quoted or not, as a string key would take it).
template <class E, std::enable_if_t<has_enum_names_v<E>, int> = 0>
void read_value(const YamlNode& node, const std::string& key, const Spec&, E& out) {
  if (node.kind == YamlNode::Kind::Scalar) {
    if (const std::optional<E> v = parse_enum<E>(node.value)) {
      out = *v;
      return;
    }
    fail(key, node, "expected one of " + enum_choices<E>() + ", got '" + node.value + "'");
  }
  fail(key, node, "expected one of " + enum_choices<E>() + ", got " + got(node));
}

void read_value(const YamlNode& node, const std::string& key, const Spec& spec,
                ResumeSetting& out) {
  std::string text;
  read_value(node, key, spec, text);
  out = ResumeSetting::parse(text);
}

std::vector<double> read_numbers(const YamlNode& node, const std::string& key,
                                 std::optional<std::size_t> length) {
  const std::string expected = length ? "expected a list of " + std::to_string(*length) + " numbers"
                                      : "expected a list of numbers";
  if (node.kind != YamlNode::Kind::Sequence) fail(key, node, expected + ", got " + got(node));
  if (length && node.children.size() != *length)
    fail(key, node, expected + ", got " + std::to_string(node.children.size()) + " of them");
  std::vector<double> out;
  for (std::size_t i = 0; i < node.children.size(); ++i)
    out.push_back(read_number(node.children[i], key + "[" + std::to_string(i) + "]"));
  return out;
}

void read_value(const YamlNode& node, const std::string& key, const Spec&,
                std::array<double, 2>& out) {
  const std::vector<double> v = read_numbers(node, key, 2);
  out = {v[0], v[1]};
}

void read_value(const YamlNode& node, const std::string& key, const Spec&,
                std::vector<double>& out) {
  out = read_numbers(node, key, std::nullopt);
}

void read_value(const YamlNode& node, const std::string& key, const Spec&,
                std::vector<std::int64_t>& out) {
  if (node.kind == YamlNode::Kind::Null) {
    out.clear();
    return;
  }
  if (node.kind != YamlNode::Kind::Sequence)
    fail(key, node, "expected a list of integers, got " + got(node));
  out.clear();
  for (std::size_t i = 0; i < node.children.size(); ++i)
    out.push_back(read_int(node.children[i], key + "[" + std::to_string(i) + "]", false));
}

// The node at a dotted path; nullptr when absent or under a null section. Sections are
// known to be mappings or null (check_keys ran first).
const YamlNode* lookup(const YamlNode& root, std::string_view path) {
  const YamlNode* node = &root;
  while (node != nullptr) {
    const std::size_t dot = path.find('.');
    if (node->kind != YamlNode::Kind::Map) return nullptr;
    node = node->find(path.substr(0, dot));
    if (dot == std::string_view::npos) return node;
    path.remove_prefix(dot + 1);
  }
  return nullptr;
}

/// Reads every given key into the config.
class ReadVisitor {
 public:
  ReadVisitor(const YamlNode& root, GivenKeys& given) : root_(root), given_(given) {}
  void section(const char*, const char*) {}
  template <class T>
  void field(const char* path, const Spec& spec, T& out) {
    const YamlNode* node = lookup(root_, path);
    if (node == nullptr) return;
    read_value(*node, path, spec, out);
    given_[path] = node->where;
  }

 private:
  const YamlNode& root_;
  GivenKeys& given_;
};

// ---------------------------------------------------------------------------------------
// Range checks on the typed config
// ---------------------------------------------------------------------------------------

std::string range_text(const Spec& spec) {
  if (spec.min && spec.max)
    return std::string("in ") + (spec.min_open ? "(" : "[") + format_number(*spec.min) + ", " +
           format_number(*spec.max) + (spec.max_open ? ")" : "]");
  if (spec.min) return (spec.min_open ? "> " : ">= ") + format_number(*spec.min);
  if (spec.max) return (spec.max_open ? "< " : "<= ") + format_number(*spec.max);
  return "";
}

bool in_range(double v, const Spec& spec) {
  // Checked first: comparisons with NaN raise FE_INVALID, which the tests trap.
  if (!std::isfinite(v)) return false;
  if (spec.min && (spec.min_open ? !(v > *spec.min) : !(v >= *spec.min))) return false;
  if (spec.max && (spec.max_open ? !(v < *spec.max) : !(v <= *spec.max))) return false;
  return true;
}

/// Checks every field against its Spec. Messages point at the key's location when it was
/// given, else at `fallback` (defaults and presets are valid, so that is rare).
class RangeVisitor {
 public:
  RangeVisitor(const GivenKeys& given, std::string fallback)
      : given_(given), fallback_(std::move(fallback)) {}
  void section(const char*, const char*) {}

  void field(const char* path, const Spec& spec, const std::int64_t& v) {
    if (spec.auto_zero && v == 0) return;
    if (!in_range(static_cast<double>(v), spec))
      fail(path, "must be " + range_text(spec) + (spec.auto_zero ? " or auto" : "") + ", got " +
                     std::to_string(v));
  }
  void field(const char* path, const Spec& spec, const std::uint64_t& v) {
    if ((spec.min || spec.max) && !in_range(static_cast<double>(v), spec))
      fail(path, "must be " + range_text(spec) + ", got " + std::to_string(v));
  }
  void field(const char* path, const Spec& spec, const double& v) {
    if (!std::isfinite(v)) fail(path, "must be a finite number");
    if (!in_range(v, spec)) fail(path, "must be " + range_text(spec) + ", got " + format_number(v));
  }
  void field(const char*, const Spec&, const bool&) {}
  void field(const char* path, const Spec& spec, const std::string& v) {
    if (!spec.choices.empty()) {
      if (std::find(spec.choices.begin(), spec.choices.end(), v) == spec.choices.end())
        fail(path, "expected one of " + join(spec.choices, ", ") + ", got '" + v + "'");
      return;
    }
    if (v.empty() && !spec.allow_empty) fail(path, "must not be empty");
  }
  // Parsing through the name table admits only the enumerators.
  template <class E, std::enable_if_t<has_enum_names_v<E>, int> = 0>
  void field(const char*, const Spec&, const E&) {}
  void field(const char* path, const Spec&, const ResumeSetting& v) {
    if (v.kind == ResumeSetting::Kind::path && v.path.empty()) fail(path, "must not be empty");
  }
  void field(const char* path, const Spec& spec, const std::array<double, 2>& v) {
    list(path, spec, v.data(), v.size());
  }
  void field(const char* path, const Spec& spec, const std::vector<double>& v) {
    list(path, spec, v.data(), v.size());
  }
  void field(const char* path, const Spec& spec, const std::vector<std::int64_t>& v) {
    const std::vector<double> d(v.begin(), v.end());
    list(path, spec, d.data(), d.size());
  }

 private:
  void list(const char* path, const Spec& spec, const double* v, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) {
      const std::string key = std::string(path) + "[" + std::to_string(i) + "]";
      if (!std::isfinite(v[i])) fail(path, key + " must be a finite number");
      if (!in_range(v[i], spec))
        fail(path, key + " must be " + range_text(spec) + ", got " + format_number(v[i]));
      if (spec.increasing && i > 0 && !(v[i] > v[i - 1]))
        fail(path, "must be strictly increasing, got " + format_number(v[i - 1]) + " then " +
                       format_number(v[i]));
    }
  }

  [[noreturn]] void fail(const char* path, const std::string& message) const {
    const auto it = given_.find(path);
    throw DeckError(path, it != given_.end() ? it->second : fallback_, message);
  }

  const GivenKeys& given_;
  std::string fallback_;
};

// ---------------------------------------------------------------------------------------
// Combinations
// ---------------------------------------------------------------------------------------

/// Throws for a combination of keys; the location is that of the first key of `keys`
/// that was given explicitly (the one the user most likely has to change).
[[noreturn]] void fail_combination(const GivenKeys& given, const std::string& fallback,
                                   std::initializer_list<const char*> keys,
                                   const std::string& message) {
  for (const char* k : keys) {
    const auto it = given.find(k);
    if (it != given.end()) throw DeckError(k, it->second, message);
  }
  throw DeckError(*keys.begin(), fallback, message);
}

/// Multi-head latent attention's shape keys, when kv_lora_rank selects it.
void check_mla(const ModelSection& m, const GivenKeys& given, const std::string& fallback) {
  const auto s = [](auto v) { return std::to_string(v); };
  if (!m.mla()) {
    if (m.q_lora_rank > 0)
      fail_combination(given, fallback, {"model.q_lora_rank", "model.kv_lora_rank"},
                       "model.q_lora_rank (" + s(m.q_lora_rank) +
                           ") is set but model.kv_lora_rank is 0 (standard attention); set "
                           "model.kv_lora_rank > 0 for multi-head latent attention");
    return;
  }
  if (m.qk_rope_head_dim <= 0 || m.qk_rope_head_dim % 2 != 0)
    fail_combination(given, fallback, {"model.qk_rope_head_dim", "model.kv_lora_rank"},
                     "model.qk_rope_head_dim (" + s(m.qk_rope_head_dim) +
                         ") must be even and > 0 with multi-head latent attention "
                         "(model.kv_lora_rank " +
                         s(m.kv_lora_rank) + "): RoPE rotates pairs");
  if (m.v_head_dim <= 0)
    fail_combination(given, fallback, {"model.v_head_dim", "model.kv_lora_rank"},
                     "model.v_head_dim (" + s(m.v_head_dim) +
                         ") must be > 0 with multi-head latent attention (model.kv_lora_rank " +
                         s(m.kv_lora_rank) + ")");
}

/// YaRN's keys, when model.rope_scaling.type selects it.
void check_rope_scaling(const ModelSection& m, const GivenKeys& given,
                        const std::string& fallback) {
  const RopeScalingSection& r = m.rope_scaling;
  if (r.type == RopeScalingType::none) return;
  if (!m.mla())
    fail_combination(given, fallback, {"model.rope_scaling.type", "model.kv_lora_rank"},
                     "model.rope_scaling.type yarn is implemented for multi-head latent "
                     "attention (DeepSeek-V2/V3) only; model.kv_lora_rank is 0");
  if (!(r.beta_slow < r.beta_fast))
    fail_combination(
        given, fallback, {"model.rope_scaling.beta_slow", "model.rope_scaling.beta_fast"},
        "model.rope_scaling.beta_slow (" + std::to_string(r.beta_slow) +
            ") must be below model.rope_scaling.beta_fast (" + std::to_string(r.beta_fast) + ")");
}

/// DeepSeekMoE's keys, when n_routed_experts selects it.
void check_moe(const ModelSection& m, const GivenKeys& given, const std::string& fallback) {
  const auto s = [](auto v) { return std::to_string(v); };
  if (m.n_routed_experts == 0) return;
  const std::int64_t E = m.n_routed_experts;
  if (m.num_experts_per_tok < 1 || m.num_experts_per_tok > E)
    fail_combination(given, fallback, {"model.num_experts_per_tok", "model.n_routed_experts"},
                     "model.num_experts_per_tok (" + s(m.num_experts_per_tok) +
                         ") must be in [1, model.n_routed_experts = " + s(E) + "]");
  if (m.moe_intermediate_size < 1)
    fail_combination(given, fallback, {"model.moe_intermediate_size", "model.n_routed_experts"},
                     "model.moe_intermediate_size (" + s(m.moe_intermediate_size) +
                         ") must be >= 1 with model.n_routed_experts " + s(E));
  if (m.first_k_dense_replace >= m.n_layers)
    fail_combination(given, fallback, {"model.first_k_dense_replace", "model.n_layers"},
                     "model.first_k_dense_replace (" + s(m.first_k_dense_replace) +
                         ") leaves no MoE block among model.n_layers = " + s(m.n_layers) +
                         "; set model.n_routed_experts to 0 for a dense model");
  if (E % m.n_group != 0)
    fail_combination(given, fallback, {"model.n_group", "model.n_routed_experts"},
                     "model.n_group (" + s(m.n_group) +
                         ") does not divide model.n_routed_experts (" + s(E) + ")");
  if (m.topk_group > m.n_group)
    fail_combination(
        given, fallback, {"model.topk_group", "model.n_group"},
        "model.topk_group (" + s(m.topk_group) + ") exceeds model.n_group (" + s(m.n_group) + ")");
  if (m.num_experts_per_tok > m.topk_group * (E / m.n_group))
    fail_combination(given, fallback, {"model.num_experts_per_tok", "model.topk_group"},
                     "model.num_experts_per_tok (" + s(m.num_experts_per_tok) +
                         ") exceeds the experts of the kept groups (model.topk_group " +
                         s(m.topk_group) + " x " + s(E / m.n_group) + " experts per group)");
  // A sigmoid router scores a group by the sum of its two best experts (DeepSeek-V3's
  // noaux_tc routing).
  if (m.moe.score == MoeScore::sigmoid && m.n_group > 1 && E / m.n_group < 2)
    fail_combination(given, fallback, {"model.n_group", "model.n_routed_experts"},
                     "model.n_group (" + s(m.n_group) + ") leaves " + s(E / m.n_group) +
                         " expert per group; group-limited routing scores a group by its two "
                         "best experts");
}

/// Node-limited routing (model.moe.max_nodes_per_token) and its test node map
/// (debug.expert_nodes).
void check_node_limit(const RunConfig& c, const GivenKeys& given, const std::string& fallback) {
  const auto s = [](auto v) { return std::to_string(v); };
  const ModelSection& m = c.model;
  const std::int64_t M = m.moe.max_nodes_per_token, n = c.debug.expert_nodes;
  const std::int64_t E = m.n_routed_experts;
  if (M > 0 && E == 0)
    fail_combination(given, fallback, {"model.moe.max_nodes_per_token", "model.n_routed_experts"},
                     "model.moe.max_nodes_per_token " + s(M) +
                         " needs a DeepSeekMoE model (model.n_routed_experts > 0)");
  if (m.moe.capacity_factor > 0.0 && E == 0)
    fail_combination(given, fallback, {"model.moe.capacity_factor", "model.n_routed_experts"},
                     "model.moe.capacity_factor needs a DeepSeekMoE model "
                     "(model.n_routed_experts > 0)");
  // Both limits mask experts by a coarser unit; applied one after the other, the second
  // could leave fewer than top-k experts. DeepSeek-V3 bounds its nodes with groups alone
  // when groups are nodes; here one or the other (group-limited routing that keeps every
  // group masks nothing).
  if (M > 0 && m.n_group > 1 && m.topk_group < m.n_group)
    fail_combination(given, fallback, {"model.moe.max_nodes_per_token", "model.topk_group"},
                     "model.moe.max_nodes_per_token " + s(M) +
                         " and group-limited routing (model.topk_group " + s(m.topk_group) +
                         " of model.n_group " + s(m.n_group) +
                         " groups) are not combined: use one of them (with groups laid out as "
                         "nodes, group-limited routing is node-limited routing)");
  if (n > 0 && E == 0)
    fail_combination(
        given, fallback, {"debug.expert_nodes", "model.n_routed_experts"},
        "debug.expert_nodes " + s(n) + " needs a DeepSeekMoE model (model.n_routed_experts > 0)");
  if (n > 0 && E % n != 0)
    fail_combination(
        given, fallback, {"debug.expert_nodes", "model.n_routed_experts"},
        "debug.expert_nodes (" + s(n) + ") does not divide model.n_routed_experts (" + s(E) + ")");
  if (M > 0 && n > M && M * (E / n) < m.num_experts_per_tok)
    fail_combination(given, fallback, {"model.moe.max_nodes_per_token", "debug.expert_nodes"},
                     "model.moe.max_nodes_per_token (" + s(M) + ") x " + s(E / n) +
                         " experts per node (debug.expert_nodes " + s(n) +
                         ") is fewer than model.num_experts_per_tok (" + s(m.num_experts_per_tok) +
                         ")");
}

/// parallel.pipeline, pipeline_layers and pipeline_schedule, and what pipeline stages do
/// not support yet.
void check_pipeline(const RunConfig& c, const GivenKeys& given, const std::string& fallback) {
  const auto s = [](auto v) { return std::to_string(v); };
  const std::int64_t P = c.parallel.pipeline;
  // One stage pipelines nothing: its schedule and chunks do not matter.
  const std::int64_t V = P > 1 ? c.parallel.virtual_stages : 1;
  const bool interleaved = P > 1 && c.parallel.pipeline_schedule == PipelineSchedule::interleaved;
  const ModelSection& m = c.model;
  if (V > 1 && !interleaved)
    fail_combination(given, fallback, {"parallel.virtual_stages", "parallel.pipeline_schedule"},
                     "parallel.virtual_stages " + s(V) +
                         " needs parallel.pipeline_schedule: interleaved (1f1b runs one chunk of "
                         "blocks per rank)");
  if (interleaved && V < 2)
    fail_combination(given, fallback, {"parallel.pipeline_schedule", "parallel.virtual_stages"},
                     "parallel.pipeline_schedule: interleaved needs parallel.virtual_stages >= 2 "
                     "(model chunks per rank; with 1 it is 1f1b)");
  const std::vector<std::int64_t>& layers = c.parallel.pipeline_layers;
  if (!layers.empty()) {
    if (static_cast<std::int64_t>(layers.size()) != P * V)
      fail_combination(given, fallback, {"parallel.pipeline_layers", "parallel.pipeline"},
                       "parallel.pipeline_layers has " + s(layers.size()) +
                           " entries; it needs one per " +
                           (V > 1 ? "virtual stage (parallel.pipeline " + s(P) +
                                        " x virtual_stages " + s(V) + " = " + s(P * V) + ")"
                                  : "pipeline stage (parallel.pipeline " + s(P) + ")"));
    std::int64_t sum = 0;
    for (const std::int64_t n : layers)
      sum += n;
    if (sum != m.n_layers)
      fail_combination(given, fallback, {"parallel.pipeline_layers", "model.n_layers"},
                       "parallel.pipeline_layers sums to " + s(sum) +
                           " blocks; it must sum to model.n_layers (" + s(m.n_layers) + ")");
  }
  if (P == 1) return;
  if (V > 1 && P * V > m.n_layers)
    fail_combination(given, fallback, {"parallel.virtual_stages", "model.n_layers"},
                     "parallel.pipeline (" + s(P) + ") x virtual_stages (" + s(V) +
                         ") exceeds model.n_layers (" + s(m.n_layers) +
                         "): every virtual stage needs at least one block");
  if (P > m.n_layers)
    fail_combination(given, fallback, {"parallel.pipeline", "model.n_layers"},
                     "parallel.pipeline (" + s(P) + ") exceeds model.n_layers (" + s(m.n_layers) +
                         "): every stage needs at least one block");
  const auto refuse = [&](const char* key, const std::string& what) {
    fail_combination(given, fallback, {key, "parallel.pipeline"},
                     what + " is not supported yet with parallel.pipeline " + s(P) +
                         " (pipeline stages send host memory over MPI); set "
                         "parallel.pipeline: 1");
  };
  if (c.kernels.backend == KernelsBackend::cuda)
    refuse("kernels.backend", "kernels.backend cuda (stages send host memory over MPI)");
  if (c.parallel.backend == ParallelBackend::nccl)
    refuse("parallel.backend", "parallel.backend nccl");
}

/// parallel.tensor: what it must divide, and what tensor parallelism does not support yet.
void check_tensor(const RunConfig& c, const GivenKeys& given, const std::string& fallback) {
  const auto s = [](auto v) { return std::to_string(v); };
  const std::int64_t T = c.parallel.tensor;
  if (c.parallel.sequence_parallel && T == 1)
    fail_combination(given, fallback, {"parallel.sequence_parallel", "parallel.tensor"},
                     "parallel.sequence_parallel splits the token rows over the tensor group and "
                     "does nothing with parallel.tensor 1; set parallel.tensor > 1 or "
                     "parallel.sequence_parallel: false");
  if (T == 1) return;
  const ModelSection& m = c.model;
  if (c.parallel.sequence_parallel && (c.training.micro_batch_size * c.data.seq_len) % T != 0)
    fail_combination(
        given, fallback,
        {"parallel.sequence_parallel", "parallel.tensor", "training.micro_batch_size",
         "data.seq_len"},
        "parallel.tensor (" + s(T) +
            ") does not divide training.micro_batch_size x "
            "data.seq_len (" +
            s(c.training.micro_batch_size) + " x " + s(c.data.seq_len) +
            "): under parallel.sequence_parallel each rank of a tensor group keeps the "
            "same share of a micro-batch's token rows");
  const auto divides = [&](const char* key, std::int64_t value, const char* what) {
    if (value % T != 0)
      fail_combination(given, fallback, {"parallel.tensor", key},
                       "parallel.tensor (" + s(T) + ") does not divide " + key + " (" + s(value) +
                           "): each rank of a tensor group holds the same share of the " + what);
  };
  const auto refuse = [&](const char* key, const std::string& what) {
    fail_combination(given, fallback, {key, "parallel.tensor"},
                     what + " is not supported yet with parallel.tensor " + s(T) +
                         " (tensor parallelism is built for decoders of standard or latent "
                         "attention, dense or DeepSeekMoE, on host memory); set "
                         "parallel.tensor: 1");
  };
  if (c.kernels.backend == KernelsBackend::cuda)
    refuse("kernels.backend", "kernels.backend cuda (the tensor group reduces host memory)");
  if (c.parallel.backend == ParallelBackend::nccl)
    refuse("parallel.backend", "parallel.backend nccl");
  divides("model.n_heads", m.n_heads, "attention heads");  // latent attention's too
  // Key/value heads split like the query heads (each rank's query heads read its own key/
  // value heads) when T divides them; fewer than T: each is replicated on T / n_kv_heads
  // ranks (Megatron-LM's rule), which needs n_kv_heads to divide T.
  if (m.n_kv_heads % T != 0 && T % m.n_kv_heads != 0)
    fail_combination(given, fallback, {"parallel.tensor", "model.n_kv_heads"},
                     "parallel.tensor (" + s(T) +
                         ") neither divides nor is a multiple of "
                         "model.n_kv_heads (" +
                         s(m.n_kv_heads) +
                         "): each rank of a tensor group holds the same share of the key/value "
                         "heads (T / n_kv_heads ranks share each head when T > n_kv_heads)");
  // (A DeepSeekMoE layer is not split: only the dense blocks' MLPs.)
  if (m.n_routed_experts == 0 || m.first_k_dense_replace > 0)
    divides("model.ffn_dim", m.ffn_dim, "MLP's hidden columns");
  divides("model.vocab_size", m.vocab_size, "vocabulary (embedding and head rows)");
}

void check_combinations(const RunConfig& c, const GivenKeys& given, const std::string& fallback) {
  const auto s = [](auto v) { return std::to_string(v); };
  const ModelSection& m = c.model;
  if (!m.mla() && m.d_model % m.n_heads != 0)
    fail_combination(given, fallback, {"model.d_model", "model.n_heads"},
                     "model.d_model (" + s(m.d_model) + ") is not divisible by model.n_heads (" +
                         s(m.n_heads) + ")");
  if (!m.mla() && (m.d_model / m.n_heads) % 2 != 0)
    fail_combination(given, fallback, {"model.d_model", "model.n_heads"},
                     "the head dimension model.d_model / model.n_heads = " + s(m.d_model) + " / " +
                         s(m.n_heads) + " = " + s(m.d_model / m.n_heads) +
                         " is odd; RoPE rotates pairs and needs an even head dimension");
  if (m.n_heads % m.n_kv_heads != 0)
    fail_combination(given, fallback, {"model.n_kv_heads", "model.n_heads"},
                     "model.n_heads (" + s(m.n_heads) + ") is not divisible by model.n_kv_heads (" +
                         s(m.n_kv_heads) + ")");
  check_mla(m, given, fallback);
  check_rope_scaling(m, given, fallback);
  check_moe(m, given, fallback);
  check_node_limit(c, given, fallback);
  // The MTP module predicts token t+2: a sequence of one token has no such target.
  if (m.mtp_depth > 0 && c.data.seq_len < 2)
    fail_combination(given, fallback, {"model.mtp_depth", "data.seq_len"},
                     "model.mtp_depth " + s(m.mtp_depth) + " needs data.seq_len >= 2 (got " +
                         s(c.data.seq_len) + "): the MTP module predicts the token after next");
  if (c.data.seq_len > m.max_seq_len)
    fail_combination(given, fallback, {"data.seq_len", "model.max_seq_len"},
                     "data.seq_len (" + s(c.data.seq_len) + ") exceeds model.max_seq_len (" +
                         s(m.max_seq_len) + ")");

  check_tensor(c, given, fallback);
  check_pipeline(c, given, fallback);

  // Expert parallelism splits the routed experts: a dense model has none to split.
  if (c.parallel.expert > 1 && m.n_routed_experts == 0)
    fail_combination(given, fallback, {"parallel.expert", "model.n_routed_experts"},
                     "parallel.expert " + s(c.parallel.expert) +
                         " needs a DeepSeekMoE model (model.n_routed_experts > 0)");
  if (c.parallel.expert > 1 && m.n_routed_experts % c.parallel.expert != 0)
    fail_combination(given, fallback, {"parallel.expert", "model.n_routed_experts"},
                     "parallel.expert (" + s(c.parallel.expert) +
                         ") does not divide model.n_routed_experts (" + s(m.n_routed_experts) +
                         "): each rank of an expert group holds the same number of experts");
  if (c.parallel.expert > 1 && c.parallel.backend == ParallelBackend::nccl)
    fail_combination(given, fallback, {"parallel.expert", "parallel.backend"},
                     "parallel.expert " + s(c.parallel.expert) +
                         " is not supported with parallel.backend nccl (the all-to-all exists "
                         "for MPI only, over host memory)");

  // The trainer's ZeRO path works on host memory (MPI, shm) only (the NCCL back end has
  // the shard collectives, not yet run on a GPU); a GPU run that resolves auto to NCCL is
  // refused by the trainer, which knows the back end.
  if (c.parallel.zero_stage > 0 && c.parallel.backend == ParallelBackend::nccl)
    fail_combination(given, fallback, {"parallel.zero_stage", "parallel.backend"},
                     "parallel.zero_stage " + s(c.parallel.zero_stage) +
                         " is not supported with parallel.backend nccl yet (ZeRO's reduce-scatter "
                         "onto shards exists for the mpi and shm back ends)");

  const TrainingSection& t = c.training;
  if (t.global_batch_size > 0 && t.grad_accum_steps > 0)
    fail_combination(given, fallback, {"training.grad_accum_steps", "training.global_batch_size"},
                     "training.global_batch_size (" + s(t.global_batch_size) +
                         ") and training.grad_accum_steps (" + s(t.grad_accum_steps) +
                         ") are both set; give one (set training.global_batch_size to 0 to use "
                         "grad_accum_steps)");
  if (t.global_batch_size == 0 && t.grad_accum_steps == 0)
    fail_combination(given, fallback, {"training.global_batch_size", "training.grad_accum_steps"},
                     "training.global_batch_size is 0 (derived) but training.grad_accum_steps is "
                     "not set; give one of them");
  if (t.global_batch_size > 0 && t.global_batch_size % t.micro_batch_size != 0)
    fail_combination(given, fallback, {"training.global_batch_size", "training.micro_batch_size"},
                     "training.global_batch_size (" + s(t.global_batch_size) +
                         ") is not a multiple of training.micro_batch_size (" +
                         s(t.micro_batch_size) + ")");
  if (t.schedule.milestones.size() != t.schedule.factors.size())
    fail_combination(given, fallback, {"training.schedule.milestones", "training.schedule.factors"},
                     "training.schedule.milestones has " + s(t.schedule.milestones.size()) +
                         " entries but training.schedule.factors has " +
                         s(t.schedule.factors.size()) + "; they must pair up");
}

void validate_impl(const RunConfig& c, const GivenKeys& given, const std::string& fallback) {
  RangeVisitor ranges(given, fallback);
  visit_schema(ranges, c);
  check_combinations(c, given, fallback);
}

// ---------------------------------------------------------------------------------------
// Keys, suggestions, overrides
// ---------------------------------------------------------------------------------------

struct KnownKeys {
  std::set<std::string> fields;
  std::set<std::string> sections;
  void section(const char* path, const char*) { sections.insert(path); }
  template <class T>
  void field(const char* path, const Spec&, const T&) {
    fields.insert(path);
  }
};

const KnownKeys& known_keys() {
  static const KnownKeys keys = [] {
    KnownKeys k;
    const RunConfig c;
    visit_schema(k, c);
    return k;
  }();
  return keys;
}

std::string leaf_of(std::string_view path) {
  const std::size_t dot = path.rfind('.');
  return std::string(dot == std::string_view::npos ? path : path.substr(dot + 1));
}

/// The closest known key, if one is close enough to be a plausible typo, or the key of
/// the same name in another section ("training.lr" -> "training.optimizer.lr").
std::optional<std::string> suggest(const std::string& path) {
  // Unknown paths are compared whole, so a typo in the section name is found too. A third
  // of the last component's length (1..3 edits) keeps "lt" -> "lr" and rejects "foo" ->
  // "eps".
  const std::string leaf = leaf_of(path);
  const std::size_t limit = std::clamp<std::size_t>(leaf.size() / 3, 1, 3);
  const KnownKeys& known = known_keys();
  std::optional<std::string> best;
  std::size_t best_distance = limit + 1;
  std::optional<std::string> same_leaf;
  for (const std::set<std::string>* set : {&known.fields, &known.sections}) {
    for (const std::string& candidate : *set) {
      if (candidate == path) continue;
      const std::size_t dist = core::edit_distance(path, candidate);
      if (dist < best_distance) {
        best_distance = dist;
        best = candidate;
      }
      if (!same_leaf && leaf_of(candidate) == leaf) same_leaf = candidate;
    }
  }
  return best ? best : same_leaf;
}

[[noreturn]] void unknown_key(const std::string& path, const std::string& where) {
  std::string message = "unknown key";
  if (const std::optional<std::string> s = suggest(path))
    message += " (did you mean '" + *s + "'?)";
  throw DeckError(path, where, message);
}

/// Every key must be known and every section a mapping (or empty).
void check_keys(const YamlNode& map, const std::string& prefix) {
  const KnownKeys& known = known_keys();
  for (std::size_t i = 0; i < map.keys.size(); ++i) {
    const std::string& key = map.keys[i];
    const std::string path = prefix.empty() ? key : prefix + "." + key;
    if (key.find('.') != std::string::npos)
      throw DeckError(path, map.key_wheres[i],
                      "unknown key (dotted keys are not expanded in a deck; nest them as "
                      "mappings, or use --set " +
                          path + "=...)");
    if (known.fields.count(path) != 0) continue;
    if (known.sections.count(path) == 0) unknown_key(path, map.key_wheres[i]);
    const YamlNode& child = map.children[i];
    if (child.kind == YamlNode::Kind::Map) {
      check_keys(child, path);
    } else if (child.kind != YamlNode::Kind::Null) {
      throw DeckError(path, child.where, "expected a section (a mapping), got " + got(child));
    }
  }
}

/// Puts an override's value into the tree, creating sections on the way.
void apply_override(YamlNode& root, const Override& o) {
  const TextOrigin origin{"--set " + o.text, true};
  YamlNode value = parse_yaml(o.value, origin, kMaxDeckBytes, kMaxDeckDepth);
  // Text that YAML reads as no value at all ('%' starts a directive, '#' a comment) must
  // not silently become an empty or default value.
  const auto first = o.value.find_first_not_of(" \t");
  const std::string trimmed =
      first == std::string::npos
          ? ""
          : o.value.substr(first, o.value.find_last_not_of(" \t") - first + 1);
  if (value.kind == YamlNode::Kind::Null && !trimmed.empty() && trimmed != "~" &&
      trimmed != "null" && trimmed != "Null" && trimmed != "NULL")
    throw DeckError(o.path, origin.name,
                    "'" + o.value +
                        "' is not a YAML value on its own (it starts with a YAML "
                        "indicator); quote it: --set " +
                        o.path + "='\"" + o.value + "\"'");
  YamlNode* node = &root;
  std::string_view rest = o.path;
  std::string path;
  while (true) {
    const std::size_t dot = rest.find('.');
    const std::string key(rest.substr(0, dot));
    path += path.empty() ? key : "." + key;
    if (node->kind == YamlNode::Kind::Null) {
      node->kind = YamlNode::Kind::Map;
    } else if (node->kind != YamlNode::Kind::Map) {
      const std::string parent = path.substr(0, path.size() - key.size() - 1);
      throw DeckError(parent, origin.name,
                      "is a value, not a section; cannot set '" + key + "' inside it");
    }
    YamlNode* child = node->find(key);
    if (child == nullptr) {
      node->keys.push_back(key);
      node->key_wheres.push_back(origin.name);
      node->children.emplace_back();
      child = &node->children.back();
      child->where = origin.name;
    } else if (dot == std::string_view::npos) {
      // The override replaces the value; the key keeps no location from the file.
      const auto i = static_cast<std::size_t>(child - node->children.data());
      node->key_wheres[i] = origin.name;
    }
    if (dot == std::string_view::npos) {
      *child = std::move(value);
      return;
    }
    node = child;
    rest.remove_prefix(dot + 1);
  }
}

// ---------------------------------------------------------------------------------------
// Presets
// ---------------------------------------------------------------------------------------

struct Preset {
  const char* name;
  ModelSection model;
};

ModelSection make_model(const char* name, std::int64_t vocab, std::int64_t d, std::int64_t layers,
                        std::int64_t heads, std::int64_t kv_heads, std::int64_t ffn,
                        std::int64_t seq) {
  ModelSection m;
  m.preset = name;
  m.vocab_size = vocab;
  m.d_model = d;
  m.n_layers = layers;
  m.n_heads = heads;
  m.n_kv_heads = kv_heads;
  m.ffn_dim = ffn;
  m.max_seq_len = seq;
  m.rope_theta = 10000.0;
  m.norm_eps = 1.0e-6;
  m.tie_embeddings = false;
  return m;
}

/// `m` with multi-head latent attention of the given ranks and head dims.
ModelSection with_mla(ModelSection m, std::int64_t q_lora, std::int64_t kv_lora, std::int64_t nope,
                      std::int64_t rope, std::int64_t v) {
  m.q_lora_rank = q_lora;
  m.kv_lora_rank = kv_lora;
  m.qk_nope_head_dim = nope;
  m.qk_rope_head_dim = rope;
  m.v_head_dim = v;
  return m;
}

/// `m` with DeepSeekMoE: `routed` experts of width `width` (top `k`), `shared` shared
/// ones, the first `dense` blocks dense, `groups` / `topk_groups` group-limited routing.
ModelSection with_moe(ModelSection m, std::int64_t routed, std::int64_t shared, std::int64_t k,
                      std::int64_t width, std::int64_t dense, std::int64_t groups,
                      std::int64_t topk_groups, bool norm_topk, double scaling, MoeScore score) {
  m.n_routed_experts = routed;
  m.n_shared_experts = shared;
  m.num_experts_per_tok = k;
  m.moe_intermediate_size = width;
  m.first_k_dense_replace = dense;
  m.n_group = groups;
  m.topk_group = topk_groups;
  m.norm_topk_prob = norm_topk;
  m.routed_scaling_factor = scaling;
  m.moe.score = score;
  return m;
}

/// `m` with `depth` multi-token prediction modules (the V3 report's lambda 0.3 stays).
ModelSection with_mtp(ModelSection m, std::int64_t depth) {
  m.mtp_depth = depth;
  return m;
}

const std::vector<Preset>& presets() {
  // Shapes of DeepSeek LLM 7B/67B from their published config.json files (67B uses 8
  // key/value heads: grouped-query attention); tiny and small are test-sized. The
  // schema's model.preset choices list the same names (a unit test checks).
  // deepseek-1b is no published model: the 7B's recipe (vocabulary, RoPE, norms, untied
  // head, ffn_dim about 8/3 d_model rounded to a multiple of 128) scaled down to 1.63 B
  // parameters, the size one GPU trains in bf16 at seq 2048 (docs/gpu.md).
  static const std::vector<Preset> table = {
      {"tiny", make_model("tiny", 260, 256, 4, 4, 4, 688, 256)},
      {"small", make_model("small", 4096, 512, 8, 8, 8, 1376, 512)},
      {"deepseek-1b", make_model("deepseek-1b", 102400, 2048, 24, 16, 16, 5504, 2048)},
      {"deepseek-llm-7b", make_model("deepseek-llm-7b", 102400, 4096, 30, 32, 32, 11008, 4096)},
      {"deepseek-llm-67b", make_model("deepseek-llm-67b", 102400, 8192, 95, 64, 8, 22016, 4096)},
      // tiny's shape with MLA (kv latent 64, no query compression, head dims 64 + 32 RoPE
      // / 64 value) and DeepSeekMoE in blocks 1-3: 8 routed experts of width 224, top-2,
      // plus one shared, so a token's active expert width 3 x 224 = 672 is tiny's 688 to
      // within 3% (equal active FLOPs for the learning comparison).
      {"tiny-moe",
       with_moe(with_mla(make_model("tiny-moe", 260, 256, 4, 4, 4, 688, 256), 0, 64, 64, 32, 64), 8,
                1, 2, 224, 1, 1, 1, true, 1.0, MoeScore::sigmoid)},
      // DeepSeek-V2-Lite and DeepSeek-V3 from their published config.json files, at the
      // original 4K context with RoPE as pre-trained (model.rope_scaling.type yarn is the
      // long-context option). V3 has one MTP module (num_nextn_predict_layers 1).
      {"deepseek-v2-lite",
       with_moe(with_mla(make_model("deepseek-v2-lite", 102400, 2048, 27, 16, 16, 10944, 4096), 0,
                         512, 128, 64, 128),
                64, 2, 6, 1408, 1, 1, 1, false, 1.0, MoeScore::softmax)},
      {"deepseek-v3", with_mtp(with_moe(with_mla(make_model("deepseek-v3", 129280, 7168, 61, 128,
                                                            128, 18432, 4096),
                                                 1536, 512, 128, 64, 128),
                                        256, 1, 8, 2048, 3, 8, 4, true, 2.5, MoeScore::sigmoid),
                               1)},
  };
  return table;
}

// ---------------------------------------------------------------------------------------
// Writing YAML
// ---------------------------------------------------------------------------------------

std::size_t depth_of(const char* path) {
  return static_cast<std::size_t>(
      std::count(path, path + std::char_traits<char>::length(path), '.'));
}

std::string format_list(const double* v, std::size_t n) {
  std::string out = "[";
  for (std::size_t i = 0; i < n; ++i)
    out += (i > 0 ? ", " : "") + yaml_number(v[i]);
  return out + "]";
}

std::string yaml_text(const Spec& spec, const std::int64_t& v) {
  return spec.auto_zero && v == 0 ? "auto" : std::to_string(v);
}
std::string yaml_text(const Spec&, const std::uint64_t& v) {
  return std::to_string(v);
}
std::string yaml_text(const Spec&, const double& v) {
  return yaml_number(v);
}
std::string yaml_text(const Spec&, const bool& v) {
  return v ? "true" : "false";
}
std::string yaml_text(const Spec&, const std::string& v) {
  return yaml_string(v);
}
template <class E, std::enable_if_t<has_enum_names_v<E>, int> = 0>
std::string yaml_text(const Spec&, const E& v) {
  return yaml_string(to_string(v));
}
std::string yaml_text(const Spec&, const ResumeSetting& v) {
  return yaml_string(v.text());
}
std::string yaml_text(const Spec&, const std::array<double, 2>& v) {
  return format_list(v.data(), v.size());
}
std::string yaml_text(const Spec&, const std::vector<double>& v) {
  return format_list(v.data(), v.size());
}
std::string yaml_text(const Spec&, const std::vector<std::int64_t>& v) {
  std::string out = "[";
  for (std::size_t i = 0; i < v.size(); ++i)
    out += (i > 0 ? ", " : "") + std::to_string(v[i]);
  return out + "]";
}

class YamlWriter {
 public:
  void section(const char* path, const char*) {
    const std::size_t depth = depth_of(path);
    if (depth == 0 && !out_.empty()) out_ += "\n";
    out_ += std::string(2 * depth, ' ') + leaf_of(path) + ":\n";
  }
  template <class T>
  void field(const char* path, const Spec& spec, const T& v) {
    out_ += std::string(2 * depth_of(path), ' ') + leaf_of(path) + ": " + yaml_text(spec, v) + "\n";
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

// ---------------------------------------------------------------------------------------
// Documentation
// ---------------------------------------------------------------------------------------

std::string quoted_choices(const Spec& spec) {
  std::string out;
  for (std::size_t i = 0; i < spec.choices.size(); ++i)
    out += (i > 0 ? ", " : "") + std::string("`") + spec.choices[i] + "`";
  return out;
}

std::string type_name(const Spec& spec, const std::int64_t&) {
  return spec.auto_zero ? "integer or `auto`" : "integer";
}
std::string type_name(const Spec&, const std::uint64_t&) {
  return "integer";
}
std::string type_name(const Spec&, const double&) {
  return "number";
}
std::string type_name(const Spec&, const bool&) {
  return "boolean";
}
std::string type_name(const Spec& spec, const std::string&) {
  return spec.choices.empty() ? "string" : "enum";
}
template <class E, std::enable_if_t<has_enum_names_v<E>, int> = 0>
std::string type_name(const Spec&, const E&) {
  return "enum";
}
std::string type_name(const Spec&, const ResumeSetting&) {
  return "string";
}
std::string type_name(const Spec&, const std::array<double, 2>&) {
  return "list of 2 numbers";
}
std::string type_name(const Spec&, const std::vector<double>&) {
  return "list of numbers";
}
std::string type_name(const Spec&, const std::vector<std::int64_t>&) {
  return "list of integers";
}

template <class T>
std::string allowed_text(const Spec& spec, const T&) {
  if (spec.note != nullptr) return spec.note;
  if (!spec.choices.empty()) return quoted_choices(spec);
  if constexpr (has_enum_names_v<T>) return "`" + enum_choices<T>("`, `") + "`";
  std::string out;
  if constexpr (std::is_same_v<T, std::string> || std::is_same_v<T, ResumeSetting>) {
    out = spec.allow_empty ? "any" : "non-empty";
  } else if constexpr (std::is_same_v<T, bool>) {
    out = "`true`, `false`";
  } else if constexpr (std::is_same_v<T, std::array<double, 2>> ||
                       std::is_same_v<T, std::vector<double>> ||
                       std::is_same_v<T, std::vector<std::int64_t>>) {
    out = "each " + range_text(spec);
    if (spec.increasing) out += ", strictly increasing";
  } else {
    out = range_text(spec);
    if (spec.auto_zero) out = "`auto` or " + out;
  }
  return out.empty() ? "any" : out;
}

class KeyInfoCollector {
 public:
  void section(const char*, const char*) {}
  template <class T>
  void field(const char* path, const Spec& spec, const T& v) {
    keys.push_back({path, type_name(spec, v), yaml_text(spec, v), allowed_text(spec, v), spec.doc});
  }
  std::vector<KeyInfo> keys;
};

class MarkdownWriter {
 public:
  void section(const char* path, const char* doc) {
    out_ += "\n### `" + std::string(path) + "`\n\n" + doc + "\n\n";
    out_ += "| Key | Type | Default | Allowed | Description |\n";
    out_ += "|---|---|---|---|---|\n";
  }
  template <class T>
  void field(const char* path, const Spec& spec, const T& v) {
    out_ += "| `" + leaf_of(path) + "` | " + type_name(spec, v) + " | `" + yaml_text(spec, v) +
            "` | " + allowed_text(spec, v) + " | " + spec.doc + " |\n";
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

}  // namespace
}  // namespace detail

// -----------------------------------------------------------------------------------------
// Public API
// -----------------------------------------------------------------------------------------

Override parse_override(std::string_view text) {
  const std::string where = "--set " + std::string(text);
  const std::size_t eq = text.find('=');
  if (eq == std::string_view::npos)
    throw DeckError("", where, "expected path=value (for example training.max_steps=10)");
  Override o;
  o.text = std::string(text);
  o.value = std::string(text.substr(eq + 1));
  std::string_view path = text.substr(0, eq);
  while (!path.empty() && path.back() == ' ')
    path.remove_suffix(1);
  while (!path.empty() && path.front() == ' ')
    path.remove_prefix(1);
  if (path.empty()) throw DeckError("", where, "the key path before '=' is empty");
  // Empty components ("training..lr") or white space inside the path are typos that no
  // key can match; say so instead of "unknown key".
  std::size_t start = 0;
  while (true) {
    const std::size_t dot = path.find('.', start);
    const std::string_view part =
        path.substr(start, dot == std::string_view::npos ? dot : dot - start);
    if (part.empty() || part.find_first_of(" \t") != std::string_view::npos)
      throw DeckError(std::string(path), where, "malformed key path");
    if (dot == std::string_view::npos) break;
    start = dot + 1;
  }
  o.path = std::string(path);
  return o;
}

RunConfig load_deck_text(std::string_view text, std::string_view source_name,
                         const std::vector<Override>& overrides) {
  using namespace detail;
  const TextOrigin origin{std::string(source_name), false};
  YamlNode root = parse_yaml(text, origin, kMaxDeckBytes, kMaxDeckDepth);
  if (root.kind == YamlNode::Kind::Null)
    throw DeckError("", origin.name,
                    "the deck is empty (expected a mapping of sections such as run:, model:, "
                    "training:)");
  if (root.kind != YamlNode::Kind::Map)
    throw DeckError("", root.where,
                    "a deck must be a mapping of sections (run:, model:, ...), got " + got(root));
  for (const Override& o : overrides)
    apply_override(root, o);
  check_keys(root, "");

  RunConfig config;
  GivenKeys given;
  // The preset decides the model section's defaults, so it is read first; explicit keys
  // then overwrite the preset's values.
  if (const YamlNode* preset = lookup(root, "model.preset")) {
    std::string name;
    read_value(*preset, "model.preset", Spec(""), name);
    const auto& table = presets();
    const auto it =
        std::find_if(table.begin(), table.end(), [&](const Preset& p) { return name == p.name; });
    if (it == table.end()) {
      std::string names;
      for (const std::string& n : preset_names())
        names += (names.empty() ? "" : ", ") + n;
      throw DeckError("model.preset", preset->where,
                      "unknown preset '" + name + "' (presets: " + names + ")");
    }
    config.model = it->model;
  }
  ReadVisitor reader(root, given);
  visit_schema(reader, config);
  if (given.count("data.seq_len") == 0) config.data.seq_len = config.model.max_seq_len;
  validate_impl(config, given, origin.name);
  return config;
}

std::string read_deck_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DeckError("", path, "cannot open the deck file");
  // Read at most one byte past the limit, so a huge (or endless) file is not slurped.
  std::string text(kMaxDeckBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (in.bad()) throw DeckError("", path, "cannot read the deck file");
  text.resize(static_cast<std::size_t>(in.gcount()));
  if (text.size() > kMaxDeckBytes)
    throw DeckError(
        "", path,
        "the deck file is larger than the limit of " + std::to_string(kMaxDeckBytes) + " bytes");
  return text;
}

RunConfig load_deck_file(const std::string& path, const std::vector<Override>& overrides) {
  return load_deck_text(read_deck_file(path), path, overrides);
}

void validate(const RunConfig& config) {
  detail::validate_impl(config, {}, "");
}

Layout resolve_layout(const RunConfig& config, int world_size) {
  if (world_size < 1)
    throw Error("resolve_layout: the world size must be >= 1, got " + std::to_string(world_size));
  validate(config);
  const auto s = [](auto v) { return std::to_string(v); };
  const std::string world = "world size " + s(world_size);
  const ParallelSection& p = config.parallel;
  // The world is pipeline x data x tensor ranks (comm/process_groups.hpp).
  const std::int64_t model_ranks = p.pipeline * p.tensor;
  if (world_size % model_ranks != 0)
    throw DeckError(p.tensor > 1 ? "parallel.tensor" : "parallel.pipeline", world,
                    "parallel.pipeline x parallel.tensor (" + s(p.pipeline) + " x " + s(p.tensor) +
                        ") does not divide the " + world +
                        ": every stage and tensor slice needs the same number of data-parallel "
                        "ranks");
  const std::int64_t data = world_size / model_ranks;
  if (p.data != 0 && p.data != data)
    throw DeckError("parallel.data", world,
                    "parallel.data (" + s(p.data) +
                        ") must be the world size / (parallel.pipeline x parallel.tensor) (" +
                        s(world_size) + " / " + s(model_ranks) + " = " + s(data) +
                        ") or auto: every rank is a data-parallel rank of one stage and slice");

  const TrainingSection& t = config.training;
  std::int64_t per_micro_step = 0;  // sequences per micro-step over all data ranks
  if (__builtin_mul_overflow(t.micro_batch_size, data, &per_micro_step))
    throw DeckError("training.micro_batch_size", world,
                    "training.micro_batch_size x data-parallel ranks overflows");
  if (data % p.expert != 0)
    throw DeckError("parallel.expert", world,
                    "parallel.expert (" + s(p.expert) +
                        ") does not divide the data-parallel ranks (" + s(data) +
                        "): expert groups are made of consecutive data ranks");
  Layout layout;
  layout.world_size = world_size;
  layout.data = static_cast<int>(data);
  layout.pipeline = static_cast<int>(p.pipeline);
  layout.tensor = static_cast<int>(p.tensor);
  layout.expert = static_cast<int>(p.expert);
  if (config.model.n_kv_heads > 0 && p.tensor > config.model.n_kv_heads && !config.model.mla())
    layout.kv_replicas = static_cast<int>(p.tensor / config.model.n_kv_heads);
  if (t.global_batch_size > 0) {
    if (t.global_batch_size % per_micro_step != 0)
      throw DeckError("training.global_batch_size", world,
                      "training.global_batch_size (" + s(t.global_batch_size) +
                          ") is not divisible by training.micro_batch_size (" +
                          s(t.micro_batch_size) + ") x data-parallel ranks (" + s(data) +
                          ") = " + s(per_micro_step));
    layout.global_batch_size = t.global_batch_size;
    layout.grad_accum_steps = t.global_batch_size / per_micro_step;
  } else {
    layout.grad_accum_steps = t.grad_accum_steps;
    if (__builtin_mul_overflow(per_micro_step, t.grad_accum_steps, &layout.global_batch_size))
      throw DeckError("training.grad_accum_steps", world,
                      "training.micro_batch_size x data-parallel ranks x "
                      "training.grad_accum_steps overflows");
  }
  // The interleaved schedule runs the micro-batches in groups of the stages.
  if (p.pipeline > 1 && p.pipeline_schedule == PipelineSchedule::interleaved &&
      layout.grad_accum_steps % p.pipeline != 0)
    throw DeckError(
        t.global_batch_size > 0 ? "training.global_batch_size" : "training.grad_accum_steps", world,
        "parallel.pipeline_schedule interleaved runs the micro-batches in groups of "
        "the " +
            s(p.pipeline) + " pipeline stages, but a step has " + s(layout.grad_accum_steps) +
            " (training.grad_accum_steps: global batch / (micro-batch x data ranks)); "
            "make it a multiple of parallel.pipeline");
  return layout;
}

std::vector<std::int64_t> pipeline_stage_layers(const RunConfig& config) {
  const std::int64_t P = config.parallel.pipeline *
                         (config.parallel.pipeline > 1 ? config.parallel.virtual_stages : 1);
  const std::int64_t L = config.model.n_layers;
  if (!config.parallel.pipeline_layers.empty()) return config.parallel.pipeline_layers;
  std::vector<std::int64_t> out;
  for (std::int64_t s = 0; s < P; ++s)
    out.push_back(L / P + (s < L % P ? 1 : 0));
  return out;
}

namespace detail {
// Collects the keys whose values differ between two configs, as YAML text.
struct DiffVisitor {
  std::vector<KeyChange> changes;
  void section(const char*, const char*) {}
  template <class T>
  void field(const char* path, const Spec& spec, const T& a, const T& b) {
    if (!(a == b)) changes.push_back({path, yaml_text(spec, a), yaml_text(spec, b)});
  }
};
}  // namespace detail

std::vector<KeyChange> differences(const RunConfig& from, const RunConfig& to) {
  detail::DiffVisitor v;
  detail::visit_schema(v, from, to);
  return std::move(v.changes);
}

std::string to_yaml(const RunConfig& config) {
  detail::YamlWriter writer;
  detail::visit_schema(writer, config);
  return "# Resolved dstrain run deck (deck format 1): every key, defaults included.\n" +
         writer.take();
}

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const detail::Preset& p : detail::presets())
    names.emplace_back(p.name);
  return names;
}

ModelSection preset_model(const std::string& name) {
  for (const detail::Preset& p : detail::presets())
    if (name == p.name) return p.model;
  std::string names;
  for (const std::string& n : preset_names())
    names += (names.empty() ? "" : ", ") + n;
  throw DeckError("model.preset", "", "unknown preset '" + name + "' (presets: " + names + ")");
}

std::vector<KeyInfo> schema_keys() {
  detail::KeyInfoCollector collector;
  const RunConfig defaults;
  detail::visit_schema(collector, defaults);
  return std::move(collector.keys);
}

std::string deck_reference_markdown() {
  detail::MarkdownWriter writer;
  const RunConfig defaults;
  detail::visit_schema(writer, defaults);
  return "<!-- BEGIN generated key reference (deck_docgen); do not edit by hand -->\n"
         "## Key reference\n\n"
         "Defaults are those of the `tiny` preset; `data.seq_len` defaults to "
         "`model.max_seq_len`.\n" +
         writer.take() + "<!-- END generated key reference -->\n";
}

std::vector<std::string> advisories(const RunConfig& config) {
  std::vector<std::string> out;
  const TrainingSection& t = config.training;
  // Legal (a short smoke run of a long deck: --set training.max_steps=10), but the
  // learning rate then never reaches its peak, which is worth saying.
  if (t.schedule.type != ScheduleType::constant && t.schedule.warmup_steps > t.max_steps)
    out.push_back("training.schedule.warmup_steps (" + std::to_string(t.schedule.warmup_steps) +
                  ") exceeds training.max_steps (" + std::to_string(t.max_steps) +
                  "): the learning rate never reaches training.optimizer.lr");
  return out;
}

}  // namespace dst::config
