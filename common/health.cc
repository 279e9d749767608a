#include "common/health.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"

namespace ps {

const char* ServingName(Serving s) {
  switch (s) {
    case Serving::kStarting:
      return "starting";
    case Serving::kServing:
      return "serving";
    case Serving::kStopping:
      return "stopping";
  }
  return "unknown";
}

void EnableGrpcHealthService() { grpc::EnableDefaultHealthCheckService(true); }

NodeHealth::NodeHealth(std::vector<std::string> services)
    : services_(std::move(services)) {}

void NodeHealth::Attach(grpc::HealthCheckServiceInterface* h) {
  absl::MutexLock l(&mu_);
  grpc_ = h;
  if (grpc_ == nullptr) return;
  grpc_->SetServingStatus(kLivenessService, true);
  PublishLocked();
}

void NodeHealth::Detach() {
  absl::MutexLock l(&mu_);
  grpc_ = nullptr;
}

void NodeHealth::Set(Serving s, std::string why) {
  absl::MutexLock l(&mu_);
  why_ = std::move(why);
  state_.store(s, std::memory_order_release);
  PublishLocked();
}

std::string NodeHealth::Describe() const {
  absl::MutexLock l(&mu_);
  const Serving s = state();
  if (s == Serving::kServing) return ServingName(s);
  return absl::StrCat(ServingName(s), ": ", why_);
}

void NodeHealth::PublishLocked() {
  if (grpc_ == nullptr) return;
  const bool up = state() == Serving::kServing;
  // Per name: SetServingStatus(bool) alone would flip "liveness" too.
  grpc_->SetServingStatus("", up);
  for (const std::string& name : services_) grpc_->SetServingStatus(name, up);
}

}  // namespace ps
