#include "model/layers/moe_router.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>

#include "core/error.hpp"

namespace dst::model {

RouterShape RouterShape::of(const config::ModelSection& m) {
  RouterShape r;
  r.experts = m.n_routed_experts;
  r.top_k = m.num_experts_per_tok;
  r.groups = m.n_group;
  r.top_groups = m.topk_group;
  r.norm_topk = m.norm_topk_prob;
  r.scaling = static_cast<float>(m.routed_scaling_factor);
  r.score = m.moe.score;
  r.max_nodes = m.moe.max_nodes_per_token;
  return r;
}

std::int64_t RouterShape::nodes() const {
  std::int32_t most = 0;
  for (std::int32_t n : expert_node)
    most = std::max(most, n);
  return static_cast<std::int64_t>(most) + 1;
}

std::vector<std::int32_t> equal_expert_nodes(std::int64_t experts, std::int64_t nodes) {
  if (nodes < 1 || experts % nodes != 0)
    throw Error("model: " + std::to_string(experts) + " routed experts cannot be split over " +
                std::to_string(nodes) + " equal nodes");
  std::vector<std::int32_t> out(static_cast<std::size_t>(experts));
  for (std::int64_t e = 0; e < experts; ++e)
    out[static_cast<std::size_t>(e)] = static_cast<std::int32_t>(e / (experts / nodes));
  return out;
}

namespace {
/// transformers adds this to the chosen weights' sum before dividing (no division by 0).
constexpr float kNormEps = 1e-20f;

/// Indices of the k largest of v[0..n), largest first, ties to the lower index.
void top_indices(const float* v, std::int64_t n, std::int64_t k, std::vector<std::int32_t>& out) {
  out.resize(static_cast<std::size_t>(n));
  std::iota(out.begin(), out.end(), 0);
  std::partial_sort(out.begin(), out.begin() + k, out.end(), [&](std::int32_t a, std::int32_t b) {
    return v[a] > v[b] || (v[a] == v[b] && a < b);
  });
  out.resize(static_cast<std::size_t>(k));
}
}  // namespace

void route_forward(const RouterShape& r, std::int64_t n, const float* logits, const float* bias,
                   float* scores, std::int32_t* idx, float* weights) {
  const std::int64_t E = r.experts, K = r.top_k, G = r.groups, per_group = E / G;
  std::vector<float> choice(static_cast<std::size_t>(E)), group_score(static_cast<std::size_t>(G));
  std::vector<std::int32_t> top, top_groups;
  // Node-limited routing: each node's experts and its score's share of top-k.
  const bool node_limit = r.node_limited();
  const std::int64_t nodes = node_limit ? r.nodes() : 1;
  const std::int64_t per_node_best =
      std::max<std::int64_t>(1, r.max_nodes > 0 ? K / r.max_nodes : 1);
  std::vector<std::vector<float>> node_choice(static_cast<std::size_t>(nodes));
  std::vector<float> node_score(static_cast<std::size_t>(nodes));
  std::vector<std::int32_t> top_nodes;
  for (std::int64_t t = 0; t < n; ++t) {
    const float* l = logits + t * E;
    float* s = scores + t * E;
    if (r.score == config::MoeScore::sigmoid) {
      for (std::int64_t e = 0; e < E; ++e)
        s[e] = 1.0f / (1.0f + std::exp(-l[e]));
    } else {
      const float m = *std::max_element(l, l + E);
      float sum = 0.0f;
      for (std::int64_t e = 0; e < E; ++e)
        sum += (s[e] = std::exp(l[e] - m));
      for (std::int64_t e = 0; e < E; ++e)
        s[e] /= sum;
    }
    for (std::int64_t e = 0; e < E; ++e)
      choice[e] = s[e] + (bias && r.score == config::MoeScore::sigmoid ? bias[e] : 0.0f);
    if (G > 1) {
      for (std::int64_t g = 0; g < G; ++g) {
        const float* c = choice.data() + g * per_group;
        if (r.score == config::MoeScore::sigmoid) {  // V3: the sum of the group's best two
          top_indices(c, per_group, 2, top);
          group_score[g] = c[top[0]] + c[top[1]];
        } else {  // V2 (group_limited_greedy): the group's best
          group_score[g] = *std::max_element(c, c + per_group);
        }
      }
      top_indices(group_score.data(), G, r.top_groups, top_groups);
      std::vector<bool> kept(static_cast<std::size_t>(G), false);
      for (std::int32_t g : top_groups)
        kept[g] = true;
      for (std::int64_t e = 0; e < E; ++e)
        if (!kept[e / per_group]) choice[e] = -std::numeric_limits<float>::infinity();
    }
    if (node_limit) {
      for (auto& v : node_choice)
        v.clear();
      for (std::int64_t e = 0; e < E; ++e)
        node_choice[static_cast<std::size_t>(r.expert_node[static_cast<std::size_t>(e)])].push_back(
            choice[e]);
      for (std::int64_t j = 0; j < nodes; ++j) {
        const std::vector<float>& c = node_choice[static_cast<std::size_t>(j)];
        const auto m = static_cast<std::int64_t>(c.size());
        if (r.score == config::MoeScore::sigmoid) {  // V3: the sum of the node's K/M best
          top_indices(c.data(), m, std::min(per_node_best, m), top);
          float sum = 0.0f;
          for (std::int32_t i : top)
            sum += c[static_cast<std::size_t>(i)];
          node_score[static_cast<std::size_t>(j)] = sum;
        } else {  // V2 (device-limited): the node's best
          node_score[static_cast<std::size_t>(j)] = *std::max_element(c.begin(), c.end());
        }
      }
      top_indices(node_score.data(), nodes, r.max_nodes, top_nodes);
      std::vector<bool> kept(static_cast<std::size_t>(nodes), false);
      for (std::int32_t j : top_nodes)
        kept[static_cast<std::size_t>(j)] = true;
      for (std::int64_t e = 0; e < E; ++e)
        if (!kept[static_cast<std::size_t>(r.expert_node[static_cast<std::size_t>(e)])])
          choice[e] = -std::numeric_limits<float>::infinity();
    }
    top_indices(choice.data(), E, K, top);
    float sum = 0.0f;
    for (std::int64_t k = 0; k < K; ++k) {
      idx[t * K + k] = top[k];
      sum += s[top[k]];
    }
    const float denom = r.norm_topk ? sum + kNormEps : 1.0f;
    for (std::int64_t k = 0; k < K; ++k)
      weights[t * K + k] = s[top[k]] / denom * r.scaling;
  }
}

void route_backward(const RouterShape& r, std::int64_t n, const float* scores,
                    const std::int32_t* idx, const float* d_weights, const float* d_scores,
                    float* d_logits) {
  const std::int64_t E = r.experts, K = r.top_k;
  std::vector<float> ds(static_cast<std::size_t>(E));
  for (std::int64_t t = 0; t < n; ++t) {
    const float* s = scores + t * E;
    const float* dw = d_weights + t * K;
    const std::int32_t* ix = idx + t * K;
    for (std::int64_t e = 0; e < E; ++e)
      ds[e] = d_scores ? d_scores[t * E + e] : 0.0f;
    // w_k = scaling * s_k / D, D = sum_j s_j + eps (or 1): ds_k += scaling (dw_k / D -
    // sum_j dw_j s_j / D^2).
    if (r.norm_topk) {
      float sum = 0.0f, dot = 0.0f;
      for (std::int64_t k = 0; k < K; ++k) {
        sum += s[ix[k]];
        dot += dw[k] * s[ix[k]];
      }
      const float D = sum + kNormEps;
      for (std::int64_t k = 0; k < K; ++k)
        ds[ix[k]] += r.scaling * (dw[k] / D - dot / (D * D));
    } else {
      for (std::int64_t k = 0; k < K; ++k)
        ds[ix[k]] += r.scaling * dw[k];
    }
    float* dl = d_logits + t * E;
    if (r.score == config::MoeScore::sigmoid) {
      for (std::int64_t e = 0; e < E; ++e)
        dl[e] = ds[e] * s[e] * (1.0f - s[e]);
    } else {
      float dot = 0.0f;
      for (std::int64_t e = 0; e < E; ++e)
        dot += s[e] * ds[e];
      for (std::int64_t e = 0; e < E; ++e)
        dl[e] = s[e] * (ds[e] - dot);
    }
  }
}

double seq_aux_loss(const RouterShape& r, std::int64_t B, std::int64_t T, double alpha,
                    const float* scores, const std::int32_t* idx, float grad_scale,
                    float* d_scores) {
  const std::int64_t E = r.experts, K = r.top_k;
  std::vector<double> f(static_cast<std::size_t>(E)), P(static_cast<std::size_t>(E));
  double total = 0.0;
  for (std::int64_t b = 0; b < B; ++b) {
    std::fill(f.begin(), f.end(), 0.0);
    std::fill(P.begin(), P.end(), 0.0);
    for (std::int64_t t = b * T; t < (b + 1) * T; ++t) {
      for (std::int64_t k = 0; k < K; ++k)
        f[idx[t * K + k]] += static_cast<double>(E) / static_cast<double>(K * T);
      double sum = 0.0;
      for (std::int64_t e = 0; e < E; ++e)
        sum += scores[t * E + e];
      for (std::int64_t e = 0; e < E; ++e)
        P[e] += scores[t * E + e] / sum / static_cast<double>(T);
    }
    double loss = 0.0;
    for (std::int64_t e = 0; e < E; ++e)
      loss += f[e] * P[e];
    total += alpha * loss;
    if (!d_scores) continue;
    // dL/ds_t,j = alpha / (T S_t) (f_j - sum_i f_i s'_t,i), S_t = sum_j s_t,j.
    for (std::int64_t t = b * T; t < (b + 1) * T; ++t) {
      double sum = 0.0, fs = 0.0;
      for (std::int64_t e = 0; e < E; ++e)
        sum += scores[t * E + e];
      for (std::int64_t e = 0; e < E; ++e)
        fs += f[e] * scores[t * E + e] / sum;
      const double c = alpha / (static_cast<double>(T) * sum);
      for (std::int64_t e = 0; e < E; ++e)
        d_scores[t * E + e] += static_cast<float>(grad_scale * c * (f[e] - fs));
    }
  }
  return total;
}

void sort_by_expert(std::int64_t n, std::int64_t k, std::int64_t experts, const std::int32_t* idx,
                    ExpertRows& out) {
  out.offset.assign(static_cast<std::size_t>(experts + 1), 0);
  out.dropped = 0;
  out.token.resize(static_cast<std::size_t>(n * k));
  out.row.resize(static_cast<std::size_t>(n * k));
  for (std::int64_t i = 0; i < n * k; ++i)
    ++out.offset[static_cast<std::size_t>(idx[i]) + 1];
  for (std::int64_t e = 0; e < experts; ++e)
    out.offset[e + 1] += out.offset[e];
  std::vector<std::int64_t> next(out.offset.begin(), out.offset.end() - 1);
  for (std::int64_t t = 0; t < n; ++t)
    for (std::int64_t j = 0; j < k; ++j) {
      const std::int64_t row = next[static_cast<std::size_t>(idx[t * k + j])]++;
      out.token[static_cast<std::size_t>(row)] = static_cast<std::int32_t>(t);
      out.row[static_cast<std::size_t>(t * k + j)] = static_cast<std::int32_t>(row);
    }
}

std::int64_t expert_capacity(double factor, std::int64_t n, std::int64_t k, std::int64_t experts) {
  if (!(factor > 0.0)) return -1;
  return static_cast<std::int64_t>(std::ceil(
      factor * static_cast<double>(n) * static_cast<double>(k) / static_cast<double>(experts)));
}

std::int64_t apply_capacity(std::int64_t n, std::int64_t k, std::int64_t experts,
                            const float* scores, std::int64_t capacity, ExpertRows& rows) {
  rows.dropped = 0;
  if (capacity < 0) return 0;
  const std::int64_t R = n * k, E = experts;
  bool over = false;
  for (std::int64_t e = 0; e < E && !over; ++e)
    over = rows.offset[static_cast<std::size_t>(e + 1)] - rows.offset[static_cast<std::size_t>(e)] >
           capacity;
  if (!over) return 0;  // the layout stays sort_by_expert's, bit for bit
  // Which rows each expert keeps: the `capacity` best scores, ties to the lower token.
  std::vector<std::uint8_t> keep(static_cast<std::size_t>(R), 1);
  std::vector<std::int64_t> order;
  std::vector<std::int64_t> kept_offset(static_cast<std::size_t>(E + 1), 0);
  for (std::int64_t e = 0; e < E; ++e) {
    const std::int64_t r0 = rows.offset[static_cast<std::size_t>(e)],
                       count = rows.offset[static_cast<std::size_t>(e + 1)] - r0;
    kept_offset[static_cast<std::size_t>(e + 1)] =
        kept_offset[static_cast<std::size_t>(e)] + std::min(count, capacity);
    if (count <= capacity) continue;
    order.resize(static_cast<std::size_t>(count));
    std::iota(order.begin(), order.end(), r0);
    const auto score = [&](std::int64_t row) {
      return scores[static_cast<std::int64_t>(rows.token[static_cast<std::size_t>(row)]) * E + e];
    };
    // Rows are tokens ascending within an expert: the lower row is the lower token.
    std::nth_element(order.begin(), order.begin() + capacity, order.end(),
                     [&](std::int64_t a, std::int64_t b) {
                       const float sa = score(a), sb = score(b);
                       return sa > sb || (sa == sb && a < b);
                     });
    for (auto it = order.begin() + capacity; it != order.end(); ++it)
      keep[static_cast<std::size_t>(*it)] = 0;
  }
  // New positions: kept rows first (expert order, tokens ascending), then the dropped.
  std::vector<std::int32_t> moved(static_cast<std::size_t>(R)), token(static_cast<std::size_t>(R));
  std::int64_t next_dropped = kept_offset[static_cast<std::size_t>(E)];
  for (std::int64_t e = 0; e < E; ++e) {
    std::int64_t next_kept = kept_offset[static_cast<std::size_t>(e)];
    for (std::int64_t r = rows.offset[static_cast<std::size_t>(e)];
         r < rows.offset[static_cast<std::size_t>(e + 1)]; ++r) {
      const std::int64_t to = keep[static_cast<std::size_t>(r)] ? next_kept++ : next_dropped++;
      moved[static_cast<std::size_t>(r)] = static_cast<std::int32_t>(to);
      token[static_cast<std::size_t>(to)] = rows.token[static_cast<std::size_t>(r)];
    }
  }
  rows.token.swap(token);
  for (std::int32_t& r : rows.row)
    r = moved[static_cast<std::size_t>(r)];
  rows.offset.swap(kept_offset);
  rows.dropped = R - rows.offset[static_cast<std::size_t>(E)];
  return rows.dropped;
}

}  // namespace dst::model
