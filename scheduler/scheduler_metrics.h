// Issue 11: the scheduler's metrics, written at scrape time from
// SchedulerCore::GetMetricsView (docs/observability.md):
//   ps_scheduler_phase{phase}, ps_scheduler_view_epoch,
//   ps_scheduler_failovers_total, ps_scheduler_nodes{role,state},
//   ps_scheduler_worker_clock{worker}, ps_scheduler_worker_examples_total
//   {worker}, ps_scheduler_examples_total.
#pragma once

#include "common/metrics.h"
#include "scheduler/scheduler.h"

namespace ps {

void WriteSchedulerMetrics(const SchedulerCore::MetricsView& v,
                           ExpositionWriter* w);

}  // namespace ps
