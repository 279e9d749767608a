// Server-side update rules: how an averaged gradient changes a stored value.
//
// Every rule works element-wise over a contiguous run of value elements plus
// that run's optimizer state. The rules are small structs with inline
// Init/Apply; `Optimizer` holds one of each and switches on its kind once per
// call (or once per batch through `Visit`), so a table applying a gradient to
// many keys never makes a per-key virtual call.
//
// State layout: element i of a run owns state[i * state_floats() ...
// (i + 1) * state_floats()) (interleaved per element), so the state of a key's
// `dim` elements is one contiguous block of dim * state_floats() floats.
//
// Arithmetic is done per element in double and stored as float; results are
// a pure function of (config, stored value, stored state, gradient), so two
// servers applying the same gradients in the same order hold identical bits.
//
// Never a non-finite value or state: a push's gradients are finite (the
// server refuses others), but one large enough (|g| above about 1.8e19, or
// a run of them) still overflows an accumulator or a weight as stored in
// single precision, and an FTRL key then holds NaN for good (inf * 0), which
// every pull would hand the workers. An element whose update would store a
// value or state that is not finite keeps what it had, and Apply returns
// how many elements it left so (Table counts them, the server reports them).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>

#include "absl/status/statusor.h"
#include "common/config.h"

namespace ps {

enum class OptimizerKind { kSgd, kAdagrad, kFtrl, kAdam };

// "sgd", "adagrad", "ftrl", "adam".
const char* OptimizerKindName(OptimizerKind kind);

namespace optimizer_internal {

// Proximal step of L1 (soft thresholding): shrinks |w| by `t`, stopping at 0.
inline double SoftThreshold(double w, double t) {
  if (w > t) return w - t;
  if (w < -t) return w + t;
  return 0.0;
}

// 1 when x is finite, 0 for infinities and NaN (exponent bits all ones).
// An integer test, not std::isfinite or a float comparison, and an integer
// (a bool summed into a count kept GCC from vectorising the FTRL lanes), so
// that the rules' loops still run in vector registers.
inline uint32_t Finite(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return static_cast<uint32_t>((bits & 0x7f800000u) != 0x7f800000u);
}
// ok (0 or 1) ? a : b, as a blend of the bits: a select GCC keeps in
// vector registers (`x = ok ? a : x` it may turn into a conditional store).
inline float Pick(uint32_t ok, float a, float b) {
  uint32_t ua, ub;
  std::memcpy(&ua, &a, sizeof(ua));
  std::memcpy(&ub, &b, sizeof(ub));
  const uint32_t mask = 0u - ok;
  const uint32_t out = (ua & mask) | (ub & ~mask);
  float f;
  std::memcpy(&f, &out, sizeof(f));
  return f;
}

// w -= lr * (g + l2 * w); then, when l1 > 0, w = sign(w) * max(|w| - lr*l1, 0).
// No state. In single precision, as w is stored (the difference to doubles
// is below w's own rounding), so that a vector register holds twice the
// elements: a dense table's push is one pass of this over every value.
struct SgdRule {
  static constexpr int kStateFloats = 0;
  float lr = 0, l1 = 0, l2 = 0;

  void Init(float* w, float* /*state*/, size_t n) const {
    for (size_t i = 0; i < n; ++i) w[i] = 0.0f;
  }
  // The l1 test is out of the loops, and w and g never overlap, so the
  // common case (no l1) vectorises; each element's arithmetic is the same.
  // Returns the elements left as they were (their update not finite).
  size_t Apply(float* __restrict w, float* /*state*/,
               const float* __restrict g, float scale, size_t n) const {
    // 32 bits, as the lanes' masks: a 64-bit count cost the vector loop
    // half again its instructions (rows are far shorter than 2^32).
    uint32_t kept = 0;
    if (l1 > 0) {
      const float t = lr * l1;
      for (size_t i = 0; i < n; ++i) {
        const float wi = w[i] - lr * (scale * g[i] + l2 * w[i]);
        const float out = wi > t ? wi - t : (wi < -t ? wi + t : 0.0f);
        const uint32_t ok = Finite(wi);
        w[i] = Pick(ok, out, w[i]);
        kept += 1u - ok;
      }
      return kept;
    }
    for (size_t i = 0; i < n; ++i) {
      const float out = w[i] - lr * (scale * g[i] + l2 * w[i]);
      const uint32_t ok = Finite(out);
      w[i] = Pick(ok, out, w[i]);
      kept += 1u - ok;
    }
    return kept;
  }
};

// State per element: accumulator n, initialised to initial_accumulator.
// g' = g + l2*w; n += g'^2; eta = lr / sqrt(n); w -= eta * g'; then, when
// l1 > 0, w = sign(w) * max(|w| - eta*l1, 0).
struct AdagradRule {
  static constexpr int kStateFloats = 1;
  double lr = 0, l1 = 0, l2 = 0, initial_accumulator = 0;

  void Init(float* w, float* state, size_t n) const {
    for (size_t i = 0; i < n; ++i) {
      w[i] = 0.0f;
      state[i] = static_cast<float>(initial_accumulator);
    }
  }
  size_t Apply(float* w, float* state, const float* g, float scale,
               size_t n) const {
    size_t kept = 0;
    for (size_t i = 0; i < n; ++i) {
      double wi = w[i];
      double gi = static_cast<double>(scale) * g[i] + l2 * wi;
      double acc = static_cast<double>(state[i]) + gi * gi;
      double eta = lr / std::sqrt(acc);
      wi -= eta * gi;
      if (l1 > 0) wi = SoftThreshold(wi, eta * l1);
      const float acc_out = static_cast<float>(acc);
      const float w_out = static_cast<float>(wi);
      if (Finite(acc_out) && Finite(w_out)) {
        state[i] = acc_out;
        w[i] = w_out;
      } else {
        ++kept;
      }
    }
    return kept;
  }
};

// FTRL-Proximal (McMahan et al., KDD 2013, Algorithm 1). State per element:
// [z, n], both starting at 0.
//   sigma = (sqrt(n + g^2) - sqrt(n)) / alpha;  z += g - sigma * w;  n += g^2
//   w = 0                                               if |z| <= l1
//   w = -(z - sign(z) * l1) / ((beta + sqrt(n)) / alpha + l2)  otherwise
// The weight is a function of (z, n) alone: a key starts at w = 0.
struct FtrlRule {
  static constexpr int kStateFloats = 2;
  float alpha = 0, beta = 0, l1 = 0, l2 = 0;
  float inv_alpha = 0;  // 1 / alpha

  void Init(float* w, float* state, size_t n) const {
    for (size_t i = 0; i < n; ++i) {
      w[i] = 0.0f;
      state[2 * i] = 0.0f;
      state[2 * i + 1] = 0.0f;
    }
  }
  // One element's update: gradient gi (scaled), weight w, state z and acc
  // in and out; returns the new weight. Apply and the table's batched path
  // for dim-1 tables (server/table.cc, several keys side by side in vector
  // registers) both call it, so they compute the same bits.
  //
  // In single precision, as the state is stored: the square roots and the
  // division bound a key-cached push, and a vector register holds twice as
  // many floats as doubles, each float operation also taking fewer of the
  // divider's cycles. What doubles added was below the stored state's own
  // rounding: sigma * w is at most about |z| (w = -z*alpha/(beta+sqrt(n))
  // when non-zero), so the rounding of sqrt(n + g^2) - sqrt(n) moves z by
  // about an ulp of z, as storing z does; and where g^2 is below half an ulp
  // of n, n + g^2 rounds to n whether it is summed in doubles and then
  // stored or summed in floats.
  //
  // Branch-free: whether |z| > l1 is a coin toss from key to key, and a
  // mispredicted branch there flushed the square roots and divisions in
  // flight for the keys after it (a dim-1 table's update is one key per
  // call). Both sides are computed and one is selected. The divisions by
  // alpha are multiplications by inv_alpha: the square roots and the one
  // division left share a divider that bounds a cached push.
  //
  // Unconditional: z and acc are updated and the new weight returned even
  // when not finite. Apply, and the table's lanes, keep such an element as
  // it was (see the top of this file), checking the results apart, which
  // keeps this in vector registers as it was.
  float Step(float gi, float w, float& z, float& acc) const {
    const float acc_new = acc + gi * gi;
    const float sqrt_new = std::sqrt(acc_new);
    const float sigma = (sqrt_new - std::sqrt(acc)) * inv_alpha;
    z += gi - sigma * w;
    acc = acc_new;
    const float signed_l1 = z < 0 ? -l1 : l1;
    const float w_out =
        -(z - signed_l1) / ((beta + sqrt_new) * inv_alpha + l2);
    return std::abs(z) > l1 ? w_out : 0.0f;
  }
  size_t Apply(float* w, float* state, const float* g, float scale,
               size_t n) const {
    size_t kept = 0;
    for (size_t i = 0; i < n; ++i) {
      float z = state[2 * i], acc = state[2 * i + 1];
      const float w_out = Step(scale * g[i], w[i], z, acc);
      if (Finite(w_out) & Finite(z) & Finite(acc)) {
        w[i] = w_out;
        state[2 * i] = z;
        state[2 * i + 1] = acc;
      } else {
        ++kept;
      }
    }
    return kept;
  }
};

// Adam (Kingma & Ba) with bias correction; beta1 = 0.9, beta2 = 0.999,
// eps = 1e-8. State per element: [m, v, t], all starting at 0; t is the
// element's step count kept as a float (exact up to 2^24 steps; beyond that
// the bias corrections are 1 to float precision anyway). g' = g + l2*w.
// L1 is not applied by this rule.
struct AdamRule {
  static constexpr int kStateFloats = 3;
  static constexpr double kBeta1 = 0.9;
  static constexpr double kBeta2 = 0.999;
  static constexpr double kEps = 1e-8;
  double lr = 0, l2 = 0;

  void Init(float* w, float* state, size_t n) const {
    for (size_t i = 0; i < n * kStateFloats; ++i) state[i] = 0.0f;
    for (size_t i = 0; i < n; ++i) w[i] = 0.0f;
  }
  size_t Apply(float* w, float* state, const float* g, float scale,
               size_t n) const {
    // The elements of one key share their step count, so the two pow()
    // calls run once per key rather than once per element.
    size_t kept = 0;
    float cached_t = -1.0f;
    double corr1 = 1.0, corr2 = 1.0;
    for (size_t i = 0; i < n; ++i) {
      float* s = state + kStateFloats * i;
      double wi = w[i];
      double gi = static_cast<double>(scale) * g[i] + l2 * wi;
      double m = kBeta1 * s[0] + (1.0 - kBeta1) * gi;
      double v = kBeta2 * s[1] + (1.0 - kBeta2) * gi * gi;
      float t = s[2] + 1.0f;
      if (t != cached_t) {
        cached_t = t;
        corr1 = 1.0 - std::pow(kBeta1, static_cast<double>(t));
        corr2 = 1.0 - std::pow(kBeta2, static_cast<double>(t));
      }
      wi -= lr * (m / corr1) / (std::sqrt(v / corr2) + kEps);
      const float m_out = static_cast<float>(m);
      const float v_out = static_cast<float>(v);
      const float w_out = static_cast<float>(wi);
      if (Finite(m_out) && Finite(v_out) && Finite(w_out)) {
        s[0] = m_out;
        s[1] = v_out;
        s[2] = t;
        w[i] = w_out;
      } else {
        ++kept;
      }
    }
    return kept;
  }
};

}  // namespace optimizer_internal

// One configured update rule. Immutable after Create; thread-safe (all
// methods are const and touch only the caller's buffers).
class Optimizer {
 public:
  // Builds the rule named cfg.name ("sgd", "adagrad", "ftrl", "adam").
  // INVALID_ARGUMENT, naming the field ("optimizer.name",
  // "optimizer.learning_rate", ...), for an unknown name or a parameter out
  // of range: learning_rate (sgd, adagrad, adam) and alpha (ftrl) must be
  // > 0, beta >= 0, l1 >= 0, l2 >= 0, initial_accumulator (adagrad) > 0, all
  // finite.
  static absl::StatusOr<std::unique_ptr<Optimizer>> Create(
      const OptimizerConfig& cfg);

  OptimizerKind kind() const { return kind_; }

  // State floats per value element: sgd 0, adagrad 1 (n), ftrl 2 (z, n),
  // adam 3 (m, v, step count).
  int state_floats() const;

  // The factor a pushed gradient, the SUM over `examples` examples, is
  // multiplied by before Apply: 1 for ftrl, whose l1, l2 and beta then weigh
  // against the summed loss of the examples trained on (LIBLINEAR's 1/C),
  // whatever the minibatch, worker count and consistency mode; 1 / examples
  // (the mean gradient) for sgd, adagrad and adam, whose learning_rate is a
  // step per update and whose l1/l2 weigh against the mean loss, again
  // whatever the update's size. 1 when examples <= 0.
  float GradientScale(int64_t examples) const {
    if (kind_ == OptimizerKind::kFtrl || examples <= 0) return 1.0f;
    return 1.0f / static_cast<float>(examples);
  }

  // Initialises the value (to 0) and optimizer state of n elements.
  // `state` holds n * state_floats() floats (may be null when that is 0).
  void Init(float* w, float* state, size_t n) const;

  // Applies the averaged gradient g to n elements: w and state are updated
  // in place. Same as Apply(w, state, g, 1.0f, n).
  size_t Apply(float* w, float* state, const float* g, size_t n) const {
    return Apply(w, state, g, 1.0f, n);
  }
  // Applies the gradient scale * g (the caller's averaging factor folded in,
  // so no scaled copy of g is needed). Returns the elements left as they
  // were because their update was not finite.
  size_t Apply(float* w, float* state, const float* g, float scale,
               size_t n) const;

  // Calls fn(rule) once with the configured rule struct (one of the
  // optimizer_internal::*Rule types, by const reference). Callers that update
  // many keys put their key loop inside fn, so the switch on the kind happens
  // once per batch and Rule::Apply inlines into the loop. fn must return
  // void.
  template <typename Fn>
  void Visit(Fn&& fn) const {
    switch (kind_) {
      case OptimizerKind::kSgd:
        fn(sgd_);
        return;
      case OptimizerKind::kAdagrad:
        fn(adagrad_);
        return;
      case OptimizerKind::kFtrl:
        fn(ftrl_);
        return;
      case OptimizerKind::kAdam:
        fn(adam_);
        return;
    }
  }

 private:
  Optimizer() = default;

  OptimizerKind kind_ = OptimizerKind::kSgd;
  // Only the member matching kind_ is meaningful.
  optimizer_internal::SgdRule sgd_;
  optimizer_internal::AdagradRule adagrad_;
  optimizer_internal::FtrlRule ftrl_;
  optimizer_internal::AdamRule adam_;
};

}  // namespace ps
