// log-softmax and KL divergence of logit rows, in double (perplexity and KV bit allocation).
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

namespace turbokv {

// out[i] = x[i] - logsumexp(x) for x [n], in double.
inline void log_softmax(const float* x, int n, std::vector<double>& out) {
  out.resize(size_t(n));
  const double max = *std::max_element(x, x + n);
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += std::exp(double(x[i]) - max);
  const double log_z = max + std::log(sum);
  for (int i = 0; i < n; ++i) out[size_t(i)] = double(x[i]) - log_z;
}

// KL(p || q) = sum_i p_i (log p_i - log q_i) of two log-probability rows.
inline double kl_divergence(const std::vector<double>& log_p, const std::vector<double>& log_q) {
  double kl = 0;
  for (size_t i = 0; i < log_p.size(); ++i) kl += std::exp(log_p[i]) * (log_p[i] - log_q[i]);
  return kl;
}

}  // namespace turbokv
