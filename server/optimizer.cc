#include "server/optimizer.h"

#include <cmath>
#include <string>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace ps {
namespace {

// Checks one parameter; `strict` requires > 0, otherwise >= 0.
absl::Status CheckParam(const char* field, double value, bool strict) {
  if (!std::isfinite(value) || (strict ? value <= 0 : value < 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("config field optimizer.", field, ": must be ",
                     strict ? "> 0" : ">= 0", " and finite, got ", value));
  }
  return absl::OkStatus();
}

}  // namespace

const char* OptimizerKindName(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kSgd:
      return "sgd";
    case OptimizerKind::kAdagrad:
      return "adagrad";
    case OptimizerKind::kFtrl:
      return "ftrl";
    case OptimizerKind::kAdam:
      return "adam";
  }
  return "unknown";
}

absl::StatusOr<std::unique_ptr<Optimizer>> Optimizer::Create(
    const OptimizerConfig& cfg) {
  std::unique_ptr<Optimizer> opt(new Optimizer());
  PS_RETURN_IF_ERROR(CheckParam("l1", cfg.l1, /*strict=*/false));
  PS_RETURN_IF_ERROR(CheckParam("l2", cfg.l2, /*strict=*/false));
  if (cfg.name == "sgd") {
    PS_RETURN_IF_ERROR(CheckParam("learning_rate", cfg.learning_rate, true));
    opt->kind_ = OptimizerKind::kSgd;
    opt->sgd_.lr = static_cast<float>(cfg.learning_rate);
    opt->sgd_.l1 = static_cast<float>(cfg.l1);
    opt->sgd_.l2 = static_cast<float>(cfg.l2);
  } else if (cfg.name == "adagrad") {
    PS_RETURN_IF_ERROR(CheckParam("learning_rate", cfg.learning_rate, true));
    PS_RETURN_IF_ERROR(
        CheckParam("initial_accumulator", cfg.initial_accumulator, true));
    opt->kind_ = OptimizerKind::kAdagrad;
    opt->adagrad_.lr = cfg.learning_rate;
    opt->adagrad_.l1 = cfg.l1;
    opt->adagrad_.l2 = cfg.l2;
    opt->adagrad_.initial_accumulator = cfg.initial_accumulator;
  } else if (cfg.name == "ftrl") {
    PS_RETURN_IF_ERROR(CheckParam("alpha", cfg.alpha, true));
    PS_RETURN_IF_ERROR(CheckParam("beta", cfg.beta, false));
    opt->kind_ = OptimizerKind::kFtrl;
    opt->ftrl_.alpha = static_cast<float>(cfg.alpha);
    opt->ftrl_.inv_alpha = 1.0f / static_cast<float>(cfg.alpha);
    opt->ftrl_.beta = static_cast<float>(cfg.beta);
    opt->ftrl_.l1 = static_cast<float>(cfg.l1);
    opt->ftrl_.l2 = static_cast<float>(cfg.l2);
  } else if (cfg.name == "adam") {
    PS_RETURN_IF_ERROR(CheckParam("learning_rate", cfg.learning_rate, true));
    opt->kind_ = OptimizerKind::kAdam;
    opt->adam_.lr = cfg.learning_rate;
    opt->adam_.l2 = cfg.l2;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("config field optimizer.name: unknown optimizer \"",
                     cfg.name, "\" (expected sgd, adagrad, ftrl or adam)"));
  }
  return opt;
}

int Optimizer::state_floats() const {
  int n = 0;
  Visit([&n](const auto& rule) {
    n = std::remove_cvref_t<decltype(rule)>::kStateFloats;
  });
  return n;
}

void Optimizer::Init(float* w, float* state, size_t n) const {
  Visit([&](const auto& rule) { rule.Init(w, state, n); });
}

size_t Optimizer::Apply(float* w, float* state, const float* g, float scale,
                        size_t n) const {
  size_t kept = 0;
  Visit([&](const auto& rule) { kept = rule.Apply(w, state, g, scale, n); });
  return kept;
}

}  // namespace ps
