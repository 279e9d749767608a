// Issue 9, server failure in one process: ranges are replicated (one
// backup each), a server is "SIGKILLed" mid-job (it stops answering and
// heartbeating: LocalCluster::KillServer), the workers that cannot reach it
// make the scheduler probe it, its ranges fail over to their backups and
// the workers resend what was in flight to the new owners with the same
// seqs. Nothing acknowledged is lost, nothing is applied twice, and BSP
// ends with the same model as a run without the kill.
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/logging.h"
#include "gtest/gtest.h"
#include "tests/inproc_cluster.h"
#include "transport/faulty_transport.h"
#include "worker/kv_worker.h"

namespace ps {
namespace {

class FailoverTest : public ::testing::Test {
 protected:
  // PS_TEST_LOG=info (or debug) shows the cluster's moves.
  static void SetUpTestSuite() {
    const char* level = std::getenv("PS_TEST_LOG");
    InitLogging("T", level != nullptr ? level : "warn");
  }
};

JobConfig CounterJob() {
  JobConfig c;
  c.cluster.num_servers = 3;
  c.cluster.num_workers = 3;
  c.cluster.virtual_nodes = 16;
  c.cluster.heartbeat_ms = 100;
  c.cluster.heartbeat_timeout_ms = 60000;  // the probes find the dead
  c.consistency.mode = Mode::kAsp;
  // value -= lr * gradient / examples: a push of -1 adds exactly 1.
  c.optimizer.name = "sgd";
  c.optimizer.learning_rate = 1;
  c.optimizer.l1 = 0;
  c.optimizer.l2 = 0;
  c.data.format = "synthetic";
  c.data.synthetic.train_rows = 1000;
  c.data.synthetic.test_rows = 0;
  c.training.epochs = 1;
  c.fault_tolerance.replicas = 1;
  return c;
}

// The exact counter: W workers each push +1 N times (ASP, a clock every 8
// pushes) while `chaos` changes the cluster; it gets wait_for(n), which
// returns once n pushes (all workers) were acknowledged, and the total.
// With `sparsity` 1 every push adds to every key of a fixed set; with s > 1
// each push to a pseudo-random 1/s of them (as a sparse model's pushes do:
// a row one push changes is not rewritten by the next, so an update lost
// on its way to a backup stays lost). Every push was acknowledged, so every
// key must end at exactly its count of pushes on the servers that own it at
// the end: nothing acknowledged lost, nothing applied twice.
constexpr int kCounterWorkers = 3;
constexpr int kCounterPushes = 240;

void RunExactCounter(
    LocalCluster& cluster,
    const std::function<void(const std::function<void(int)>&, int)>& chaos,
    int sparsity = 1, bool bsp = false) {
  constexpr int kWorkers = kCounterWorkers;
  constexpr int kPushes = kCounterPushes;
  constexpr int kKeys = 600;
  std::vector<uint64_t> keys;
  for (int i = 0; i < kKeys; ++i) {
    keys.push_back(0x9e3779b97f4a7c15ULL * static_cast<uint64_t>(i + 1));
  }
  std::sort(keys.begin(), keys.end());
  // Whether push i of worker w adds to keys[k].
  auto touches = [sparsity](int w, int i, int k) {
    if (sparsity <= 1) return true;
    uint64_t h = (static_cast<uint64_t>(w) << 40) ^
                 (static_cast<uint64_t>(i) << 20) ^ static_cast<uint64_t>(k);
    h *= 0x9e3779b97f4a7c15ULL;
    return (h >> 40) % static_cast<uint64_t>(sparsity) == 0;
  };
  std::map<uint64_t, int> want;  // key -> pushes that add to it
  for (int w = 0; w < kWorkers; ++w) {
    for (int i = 0; i < kPushes; ++i) {
      for (int k = 0; k < kKeys; ++k) want[keys[k]] += touches(w, i, k) ? 1 : 0;
    }
  }

  absl::Notification stop;
  std::thread ticker([&] {
    while (!stop.WaitForNotificationWithTimeout(absl::Milliseconds(10))) {
      for (int i = 0; i < cluster.num_servers(); ++i) {
        cluster.server(i)->Tick();
        if (cluster.server_killed(i)) continue;
        proto::HeartbeatRequest h;
        cluster.server(i)->FillHeartbeat(&h);
        h.set_id(i);
        (void)cluster.scheduler()->Heartbeat(h);  // a spare: unknown
      }
      for (int w = 0; w < kWorkers; ++w) {
        proto::HeartbeatRequest h;
        h.set_role(proto::ROLE_WORKER);
        h.set_id(w);
        (void)cluster.scheduler()->Heartbeat(h);
      }
    }
  });

  std::atomic<int> progress{0};  // pushes acknowledged, all workers
  std::atomic<int> workers_done{0};
  std::vector<absl::Status> results(kWorkers);
  std::vector<std::thread> workers;
  std::shared_ptr<SchedulerClient> scheduler =
      cluster.clients()->Scheduler(kInProcSchedulerAddress);
  for (int w = 0; w < kWorkers; ++w) {
    workers.emplace_back([&, w] {
      absl::Cleanup done = [&] { ++workers_done; };
      KVWorkerOptions ko;
      ko.worker_id = w;
      ko.request_timeout = absl::Seconds(30);
      KVWorker kv(ko, cluster.view(), cluster.clients(), scheduler.get());
      std::vector<uint64_t> pushed;
      for (int i = 0; i < kPushes; ++i) {
        pushed.clear();
        for (int k = 0; k < kKeys; ++k) {
          if (touches(w, i, k)) pushed.push_back(keys[k]);
        }
        const std::vector<float> minus_one(pushed.size(), -1.0f);
        const int64_t ts = kv.Push(0, pushed, minus_one, 1);
        absl::Status s;
        if (!bsp) {
          // BSP answers a clock's pushes once the clock is complete: its
          // pushes are waited for with the clock.
          s = kv.Wait(ts, absl::Now() + absl::Seconds(60));
          if (!s.ok()) {
            results[w] = Annotate(s, absl::StrCat("W[", w, "] push ", i));
            return;
          }
          ++progress;
        }
        if (i % 8 == 7) {
          // BSP divides a clock's sum by the examples its workers
          // announce; none makes that a plain sum (SGD's GradientScale).
          s = kv.Wait(kv.Clock(bsp ? 0 : 8), absl::Now() + absl::Seconds(60));
          if (!s.ok()) {
            results[w] = Annotate(s, absl::StrCat("W[", w, "] clock ", i));
            return;
          }
          if (bsp) progress += 8;
        }
      }
      results[w] = kv.Finish(absl::Now() + absl::Seconds(60));
    });
  }
  const int total = kWorkers * kPushes;
  // Returns early once every worker has stopped (a failed one too: the
  // results say why).
  auto wait_for = [&](int n) {
    while (progress.load() < n && workers_done.load() < kWorkers) {
      absl::SleepFor(absl::Milliseconds(1));
    }
  };
  chaos(wait_for, total);
  for (std::thread& t : workers) t.join();
  stop.Notify();
  ticker.join();
  bool failed = false;
  for (int w = 0; w < kWorkers; ++w) {
    EXPECT_TRUE(results[w].ok()) << results[w];
    failed = failed || !results[w].ok();
  }
  if (failed) {  // what the live servers hold, for the diagnosis
    for (int i = 0; i < cluster.num_servers(); ++i) {
      if (cluster.server_killed(i) || cluster.server(i)->epoch() == 0) continue;
      std::printf("%s", cluster.server(i)->DebugRanges().c_str());
    }
  }
  for (int i = 0; i < cluster.num_servers(); ++i) {
    if (cluster.server_killed(i)) continue;
    EXPECT_TRUE(cluster.server(i)->CheckInvariants().ok()) << "S[" << i << "]";
  }
  auto values = cluster.Snapshot();
  ASSERT_EQ(values.size(), keys.size());
  int wrong = 0;
  auto routing = Routing::FromProto(cluster.view().routing());
  ASSERT_TRUE(routing.ok());
  std::map<int, int> bad_ranges;
  for (const auto& [key, v] : values) {
    if (v[0] != static_cast<float>(want[key])) {
      const int r = routing->RangeOf(key);
      if (bad_ranges[r]++ == 0) {
        ADD_FAILURE() << "key " << key << " = " << v[0] << ", want "
                      << want[key] << "; range " << r
                      << " first owned by S[" << routing->OwnerOfRange(r)
                      << "], backup S[" << routing->BackupOfRange(r, 0) << "]";
      }
      ++wrong;
    }
  }
  EXPECT_EQ(wrong, 0);
}

// Two of the three servers are killed one after the other (the second
// after the first's ranges were re-replicated).
// The test AUC of a run with faults or moves against the fault-free
// reference. BSP: the same model exactly (nothing acknowledged lost,
// nothing applied twice). SSP/ASP runs of these small jobs differ by the
// interleaving of workers already between fault-free runs (a few 0.001;
// up to 0.015 on an overloaded machine, and a moved range changes the
// interleaving too): no worse than 0.025 below the reference, any better
// (runs 0.0104 above it were seen); docs/fault_tolerance.md compares full
// a9a runs.
void ExpectAucLikeReference(double got, double ref, Mode mode,
                            const std::string& report) {
  if (mode == Mode::kBsp) {
    EXPECT_NEAR(got, ref, 1e-6) << report;
  } else {
    EXPECT_GE(got, ref - 0.025) << report;
  }
}

// Two of three servers are killed while the counter runs; with
// `deltas` false the backups replay the per-input log
// (fault_tolerance.replicate_deltas) instead of getting deltas.
void ExactCounterWhileTwoServersAreKilled(bool deltas) {
  LocalClusterOptions o;
  o.config = CounterJob();
  o.config.fault_tolerance.replicate_deltas = deltas;
  LocalCluster cluster(o);
  ASSERT_TRUE(cluster.Start().ok());
  RunExactCounter(cluster, [&](const std::function<void(int)>& wait_for,
                               int total) {
    wait_for(total / 4);
    cluster.KillServer(1);
    wait_for(total * 5 / 8);
    cluster.KillServer(2);
  }, /*sparsity=*/8);
  // S[0] owns every range now, with no backup left.
  EXPECT_EQ(cluster.server(0)->OwnedRanges().size(),
            static_cast<size_t>(cluster.view().routing().range_begin_size()));
  const std::string report = cluster.scheduler()->ReportJson();
  EXPECT_TRUE(HasFailover(report, "S[1]")) << report;
  EXPECT_TRUE(HasFailover(report, "S[2]")) << report;
}

TEST_F(FailoverTest, ExactCounterWhileServersAreKilled) {
  ExactCounterWhileTwoServersAreKilled(/*deltas=*/true);
}

TEST_F(FailoverTest, ExactCounterWhileServersAreKilledWithTheEntryLog) {
  ExactCounterWhileTwoServersAreKilled(/*deltas=*/false);
}

// Two of four servers die at the same moment (2 replicas, so every range
// keeps a holder): the failover of the first cannot tell the second its
// view; the second is probed, skipped and failed over in turn instead of
// the job failing after view_deadline.
TEST_F(FailoverTest, ExactCounterWhenTwoServersDieAtOnce) {
  LocalClusterOptions o;
  o.config = CounterJob();
  o.config.cluster.num_servers = 4;
  o.config.fault_tolerance.replicas = 2;
  LocalCluster cluster(o);
  ASSERT_TRUE(cluster.Start().ok());
  const absl::Time t0 = absl::Now();
  RunExactCounter(cluster, [&](const std::function<void(int)>& wait_for,
                               int total) {
    wait_for(total / 3 + 6);  // off the clocks, as above
    cluster.KillServer(1);
    cluster.KillServer(2);
  }, /*sparsity=*/8);
  // Well inside the 30 s view deadline a stuck broadcast would take.
  EXPECT_LT(absl::Now() - t0, absl::Seconds(20));
  auto st = cluster.scheduler()->Status();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->phase(), "running");
  EXPECT_EQ(st->view().routing().servers(1).state(), proto::NODE_DEAD);
  EXPECT_EQ(st->view().routing().servers(2).state(), proto::NODE_DEAD);
}

// Elasticity: a fourth server joins mid-run and takes its share of the
// ranges by the two-stage copy, then S[0] is drained and leaves, and a
// fifth joins after it; all while the workers push. Exactly W * N
// everywhere, every range has its replica, S[0] holds nothing.
TEST_F(FailoverTest, ExactCounterWhileServersJoinAndOneIsDrained) {
  LocalClusterOptions o;
  o.config = CounterJob();
  o.spare_servers = 2;
  LocalCluster cluster(o);
  ASSERT_TRUE(cluster.Start().ok());
  absl::StatusOr<proto::DrainResponse> drained;
  RunExactCounter(cluster, [&](const std::function<void(int)>& wait_for,
                               int total) {
    // Off the clocks (every 8th push of each worker): a move then finds
    // pushes, not clock announcements, waiting for their deltas.
    wait_for(total / 5 + 6);
    ASSERT_TRUE(cluster.JoinServer(3).ok());
    wait_for(total * 2 / 5 + 6);
    proto::DrainRequest d;
    d.set_server(0);
    drained = cluster.scheduler()->Drain(d);
    wait_for(total * 3 / 5 + 6);
    ASSERT_TRUE(cluster.JoinServer(4).ok());
  }, /*sparsity=*/8);
  ASSERT_TRUE(drained.ok()) << drained.status();
  EXPECT_GT(drained->ranges_moved(), 0);
  // S[0] left; the others (the joiners included) own every range, each
  // with one backup.
  auto st = cluster.scheduler()->Status();
  ASSERT_TRUE(st.ok());
  const proto::RoutingTable& t = st->view().routing();
  EXPECT_EQ(t.servers(0).state(), proto::NODE_LEFT);
  EXPECT_EQ(cluster.server(0)->OwnedRanges().size(), 0u);
  std::map<int, int> owned;
  for (int r = 0; r < t.range_server_size(); ++r) {
    EXPECT_NE(t.range_server(r), 0) << "range " << r;
    ASSERT_EQ(t.replicas(), 1);
    EXPECT_GE(t.range_backup(r), 1) << "range " << r;
    EXPECT_NE(t.range_backup(r), t.range_server(r)) << "range " << r;
    ++owned[t.range_server(r)];
  }
  EXPECT_GT(owned[3], 0);
  const std::string report = cluster.scheduler()->ReportJson();
  EXPECT_TRUE(FindMembership(report, "joined", "S[3]").has_value()) << report;
  EXPECT_TRUE(FindMembership(report, "drained", "S[0]").has_value()) << report;
}

// Membership changes drawn at random (seeded: the same steps each run)
// while the sparse counter runs: five steps, each a join of a spare, a
// drain or a kill of a live server, at a point off the workers' clocks,
// each once the one before has settled (every chain whole again:
// SchedulerCore::MembershipSettled); in ASP replicated by deltas ("asp")
// or by the per-input log ("log"), in BSP (replication after aggregation;
// the workers wait at each clock), and with two replicas ("r2": 4 servers;
// a step may also kill two at once). No step can lose every whole copy of
// a range (a removal leaves 1 + replicas live servers), so every key must
// end at its exact count. Seeds 4, 6, 16 and 18 each took the ring's
// servers down to one live (e.g. drain S[0], join S[3] and S[4], kill
// S[1]): the failover refilled chains from the ring's preference list
// only, where the joined servers are not, and left those ranges without a
// backup for the rest of the job (Reassign; every seed passes since).
class ChaosCounterTest
    : public FailoverTest,
      public ::testing::WithParamInterface<std::tuple<const char*, int>> {};

// The servers' states and every range's chain (owner/backups), for the
// failure messages.
std::string Chains(SchedulerCore* sched) {
  absl::StatusOr<proto::StatusResponse> st = sched->Status();
  if (!st.ok()) return st.status().ToString();
  const proto::RoutingTable& t = st->view().routing();
  std::string out;
  for (int i = 0; i < t.servers_size(); ++i) {
    absl::StrAppend(&out, "S[", i, "] ",
                    proto::NodeState_Name(t.servers(i).state()), "; ");
  }
  absl::StrAppend(&out, "chains:");
  for (int r = 0; r < t.range_server_size(); ++r) {
    absl::StrAppend(&out, " ", r, ":", t.range_server(r));
    for (int i = 0; i < t.replicas(); ++i) {
      absl::StrAppend(&out, "/", t.range_backup(r * t.replicas() + i));
    }
  }
  return out;
}

// The chaos counter: a seed draws five membership steps (join a spare,
// drain or kill a live server; with two replicas, kill two at once) while
// the sparse counter runs. With `overlap` false each step waits until the
// membership has settled (no move or copy under way, every chain whole).
// With `overlap` true only a kill waits, and only until every range has
// enough members holding a complete copy to survive it
// (FewestSyncedMembers): drains run in the background and joins do not
// wait for their share, so kills land during moves, copies and refills,
// and drains during failovers. A drain may then be refused or aborted (the
// server stays); the counter must be exact all the same.
void RunChaos(const std::string& mode, int seed, bool overlap) {
  LocalClusterOptions o;
  o.config = CounterJob();
  // "asp": deltas; "log": the per-input log; "bsp": replication after
  // aggregation.
  if (mode == "log") o.config.fault_tolerance.replicate_deltas = false;
  if (mode == "bsp") o.config.consistency.mode = Mode::kBsp;
  if (mode == "r2") {  // two replicas: two servers may die at once
    o.config.cluster.num_servers = 4;
    o.config.fault_tolerance.replicas = 2;
  }
  const int replicas = o.config.fault_tolerance.replicas;
  o.spare_servers = 3;
  LocalCluster cluster(o);
  ASSERT_TRUE(cluster.Start().ok());
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::string steps;  // what was done, for the failure messages
  std::vector<std::thread> drains;  // overlap: drains under way
  absl::Mutex drain_mu;
  std::string drained;  // overlap: how each drain ended
  SchedulerCore* sched = cluster.scheduler();
  auto state_of = [&](int id) {
    auto st = sched->Status();
    if (!st.ok() || id >= st->view().routing().servers_size()) {
      return proto::NODE_UNKNOWN;
    }
    return st->view().routing().servers(id).state();
  };
  // Waits (up to 20 s) for `done`; false on the timeout.
  auto await = [](const std::function<bool()>& done) {
    const absl::Time until = absl::Now() + absl::Seconds(20);
    while (!done()) {
      if (absl::Now() > until) return false;
      absl::SleepFor(absl::Milliseconds(5));
    }
    return true;
  };
  RunExactCounter(cluster, [&](const std::function<void(int)>& wait_for,
                               int total) {
    std::vector<int> live;
    for (int i = 0; i < o.config.cluster.num_servers; ++i) live.push_back(i);
    int spare = o.config.cluster.num_servers;
    int at_push = total / 10;  // overlap: where the next step comes
    for (int step = 0; step < 5; ++step) {
      // Overlapping steps come closer together, some at once: a step's
      // move or failover is often still under way at the next.
      if (overlap) {
        if (rng() % 2 == 0) {
          at_push += static_cast<int>(rng() % static_cast<unsigned>(total / 8));
        }
        wait_for(at_push);
      } else {
        wait_for(total * (step + 1) / 8 + 3 + static_cast<int>(rng() % 12));
        ASSERT_TRUE(await([&] { return sched->MembershipSettled(); }))
            << "not settled after: " << steps << "\n" << Chains(sched);
      }
      std::vector<char> can;
      if (spare < cluster.num_servers()) can.push_back('j');
      // A removal leaves at least 1 + replicas live servers, so that
      // every chain can be whole again.
      const int n = static_cast<int>(live.size());
      if (n >= replicas + 2) {
        can.push_back('d');
        can.push_back('k');
      }
      if (replicas >= 2 && n >= replicas + 3) can.push_back('K');
      const char what = can[rng() % can.size()];
      if (what == 'j') {
        const int id = spare++;
        absl::StrAppend(&steps, "join S[", id, "]; ");
        ASSERT_TRUE(cluster.JoinServer(id).ok()) << steps;
        ASSERT_TRUE(await([&] { return state_of(id) == proto::NODE_ALIVE; }))
            << steps;
        live.push_back(id);
        continue;
      }
      if (overlap && what != 'd') {
        // One replica survives one failure: a kill waits until every range
        // has a complete copy besides the one it may take (two for 'K').
        const int need = what == 'K' ? 3 : 2;
        ASSERT_TRUE(await([&] { return sched->FewestSyncedMembers() >= need; }))
            << "ranges not resynced after: " << steps << "\n" << Chains(sched);
      }
      const size_t at = rng() % live.size();
      const int id = live[at];
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(at));
      if (overlap && !sched->MembershipSettled()) {
        absl::StrAppend(&steps, "(unsettled) ");
      }
      if (what == 'd') {
        absl::StrAppend(&steps, "drain S[", id, "]; ");
        proto::DrainRequest d;
        d.set_server(id);
        if (overlap) {
          drains.emplace_back([&, d, id] {
            absl::StatusOr<proto::DrainResponse> r = sched->Drain(d);
            absl::MutexLock l(&drain_mu);
            absl::StrAppend(&drained, "S[", id, "]: ",
                            r.ok() ? "drained" : r.status().ToString(),
                            "; ");
            // Refused (another change in the way) or aborted (a member
            // died meanwhile, the server stays): both leave the data where
            // it was.
            EXPECT_TRUE(r.ok() || absl::IsFailedPrecondition(r.status()) ||
                        absl::IsAborted(r.status()))
                << "drain S[" << id << "]: " << r.status();
          });
          continue;
        }
        absl::StatusOr<proto::DrainResponse> r = sched->Drain(d);
        ASSERT_TRUE(r.ok()) << r.status() << " after: " << steps;
      } else if (what == 'k') {
        absl::StrAppend(&steps, "kill S[", id, "]; ");
        cluster.KillServer(id);
        // The workers' failed calls make the scheduler probe it.
        ASSERT_TRUE(await([&] { return state_of(id) == proto::NODE_DEAD; }))
            << steps;
      } else {
        const size_t at2 = rng() % live.size();
        const int id2 = live[at2];
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(at2));
        absl::StrAppend(&steps, "kill S[", id, "] and S[", id2, "]; ");
        cluster.KillServer(id);
        cluster.KillServer(id2);
        ASSERT_TRUE(await([&] {
          return state_of(id) == proto::NODE_DEAD &&
                 state_of(id2) == proto::NODE_DEAD;
        })) << steps;
      }
    }
    for (std::thread& t : drains) t.join();
    // The last step's refills too.
    EXPECT_TRUE(await([&] { return sched->MembershipSettled(); }))
        << "not settled after: " << steps << "\n" << Chains(sched);
  }, /*sparsity=*/8, /*bsp=*/mode == "bsp");
  for (std::thread& t : drains) {
    if (t.joinable()) t.join();  // a failed assertion returned early
  }
  std::printf("%s seed %d%s: %s%s\n", mode.c_str(), seed,
              overlap ? " (overlapping)" : "", steps.c_str(), drained.c_str());
}

TEST_P(ChaosCounterTest, ExactCounterThroughRandomJoinsDrainsAndKills) {
  RunChaos(std::get<0>(GetParam()), std::get<1>(GetParam()),
           /*overlap=*/false);
}

// More seeds than the suite runs, for exploring: PS_CHAOS_SEEDS=FIRST-LAST
// instantiates Explore/ChaosCounterTest.* and Explore/ChaosOverlapTest.*
// over every mode and those seeds (none when it is unset), e.g.
//   PS_CHAOS_SEEDS=25-48 build/tests/failover_test --gtest_filter='Explore/*'
std::vector<std::tuple<const char*, int>> ExploreSeeds() {
  std::vector<std::tuple<const char*, int>> out;
  const char* env = std::getenv("PS_CHAOS_SEEDS");
  int first = 0, last = -1;
  if (env == nullptr || std::sscanf(env, "%d-%d", &first, &last) != 2) {
    return out;
  }
  for (const char* mode : {"asp", "log", "bsp", "r2"}) {
    for (int seed = first; seed <= last; ++seed) out.emplace_back(mode, seed);
  }
  return out;
}

std::string SeedName(
    const ::testing::TestParamInfo<std::tuple<const char*, int>>& info) {
  return absl::StrCat(std::get<0>(info.param), "_", std::get<1>(info.param));
}

// Seeds 1-24 of asp, log and bsp and 1-12 of r2 passed (stop 52); the
// suite runs those that took the ring's servers down to one live, a few
// more for the other paths, and r2's with two servers killed at once.
INSTANTIATE_TEST_SUITE_P(
    Seeds, ChaosCounterTest,
    ::testing::Values(std::make_tuple("asp", 4), std::make_tuple("asp", 6),
                      std::make_tuple("asp", 16), std::make_tuple("asp", 18),
                      std::make_tuple("log", 8), std::make_tuple("log", 12),
                      std::make_tuple("bsp", 4), std::make_tuple("bsp", 10),
                      std::make_tuple("bsp", 12), std::make_tuple("bsp", 18),
                      std::make_tuple("r2", 2), std::make_tuple("r2", 6),
                      std::make_tuple("r2", 10), std::make_tuple("r2", 11)),
    SeedName);
INSTANTIATE_TEST_SUITE_P(Explore, ChaosCounterTest,
                         ::testing::ValuesIn(ExploreSeeds()), SeedName);

// Kills during moves, copies and refills, and drains during failovers.
class ChaosOverlapTest : public ChaosCounterTest {};

TEST_P(ChaosOverlapTest, ExactCounterThroughOverlappingChanges) {
  RunChaos(std::get<0>(GetParam()), std::get<1>(GetParam()),
           /*overlap=*/true);
}

// Seeds 1-24 of each mode passed (stop 53, after the fix of a copy that
// held up its stream: BSP hung in about 1 run of 10 of some seeds before).
// The suite runs some with a kill or drain during another step's move
// ("unsettled" in the printed steps).
INSTANTIATE_TEST_SUITE_P(
    Seeds, ChaosOverlapTest,
    ::testing::Values(std::make_tuple("asp", 7), std::make_tuple("asp", 22),
                      std::make_tuple("log", 9), std::make_tuple("bsp", 3),
                      std::make_tuple("bsp", 4), std::make_tuple("bsp", 11),
                      std::make_tuple("bsp", 13), std::make_tuple("bsp", 14),
                      std::make_tuple("r2", 10), std::make_tuple("r2", 11)),
    SeedName);
INSTANTIATE_TEST_SUITE_P(Explore, ChaosOverlapTest,
                         ::testing::ValuesIn(ExploreSeeds()), SeedName);

// A failover refills each chain with a new backup, which holds nothing
// until its primary's copy arrives. Here S[0] dies, then S[1] dies before
// (copies lost on the way) or after S[2] received its copies of the ranges
// it was added to. Before: the scheduler must not promote S[2] to owner of
// those ranges (it would serve them emptied as if nothing happened): the
// job fails with DATA_LOSS naming the range and S[2]. After (S[2]'s
// heartbeat said it holds them): S[2] takes every range and the job runs
// on.
class CopyRaceTest : public FailoverTest,
                     public ::testing::WithParamInterface<bool> {};

TEST_P(CopyRaceTest, OwnerDiesWhileTheNewBackupIsCopying) {
  const bool lose_copies = GetParam();
  std::atomic<bool> lose{false};
  LocalClusterOptions o;
  o.config = CounterJob();
  o.server_peers = [&](int, ClientFactory* inproc) {
    FaultOptions f;
    f.schedule = [&](RpcMethod m, int64_t) {
      return m == RpcMethod::kReplicate && lose.load() ? Fault::kDropRequest
                                                       : Fault::kNone;
    };
    return std::make_unique<FaultyClientFactory>(inproc, f);
  };
  LocalCluster cluster(o);
  ASSERT_TRUE(cluster.Start().ok());
  lose = lose_copies;
  SchedulerCore* sched = cluster.scheduler();
  // Kills S[id] and has the scheduler probe it (as a worker that cannot
  // reach it does); returns once a view newer than `known` is out or the
  // job ended.
  auto kill = [&](int id, int64_t known) {
    cluster.KillServer(id);
    proto::GetViewRequest req;
    req.set_role(proto::ROLE_WORKER);
    req.set_known_epoch(known);
    req.set_wait_ms(20000);
    req.add_suspect_servers(id);
    return sched->GetView(req, absl::Now() + absl::Seconds(20));
  };
  // Sends S[i]'s heartbeat once it reports the view `epoch` and, unless the
  // copies are lost, no incomplete range; returns its incomplete ranges.
  auto beat = [&](int i, int64_t epoch) {
    proto::HeartbeatRequest h;
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    for (;;) {
      h.Clear();
      cluster.server(i)->FillHeartbeat(&h);
      if (h.view_epoch() >= epoch &&
          (lose_copies || h.incomplete_ranges_size() == 0)) {
        break;
      }
      if (absl::Now() > deadline) {
        ADD_FAILURE() << "S[" << i << "] at epoch " << h.view_epoch() << ", "
                      << h.incomplete_ranges_size() << " incomplete";
        break;
      }
      absl::SleepFor(absl::Milliseconds(5));
    }
    EXPECT_TRUE(sched->Heartbeat(h).ok());
    return h.incomplete_ranges_size();
  };
  auto v = kill(0, 1);
  ASSERT_TRUE(v.ok()) << v.status();
  ASSERT_EQ(v->view().epoch(), 2);
  beat(1, 2);
  const int copying = beat(2, 2);
  if (lose_copies) {
    ASSERT_GT(copying, 0) << "S[2] was added to no range S[0] held";
  }
  v = kill(1, 2);
  ASSERT_TRUE(v.ok()) << v.status();
  auto st = sched->Status();
  ASSERT_TRUE(st.ok());
  if (lose_copies) {
    absl::Status end = sched->WaitForEnd(absl::Now() + absl::Seconds(20));
    EXPECT_EQ(end.code(), absl::StatusCode::kDataLoss) << end;
    EXPECT_NE(end.message().find("had not received a copy yet"),
              std::string::npos)
        << end;
    EXPECT_NE(end.message().find("S[2]"), std::string::npos) << end;
    return;
  }
  EXPECT_EQ(st->phase(), "running");
  const proto::RoutingTable& t = st->view().routing();
  EXPECT_EQ(t.epoch(), 3);
  for (int r = 0; r < t.range_server_size(); ++r) {
    EXPECT_EQ(t.range_server(r), 2) << "range " << r;
  }
  beat(2, 3);  // S[2] installed the view (it is sent after GetView answers)
  EXPECT_EQ(cluster.server(2)->OwnedRanges().size(),
            static_cast<size_t>(t.range_server_size()));
  EXPECT_TRUE(cluster.server(2)->CheckInvariants().ok());
}

INSTANTIATE_TEST_SUITE_P(Copies, CopyRaceTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? "Lost" : "Arrived";
                         });

// What a drain or a join cannot do is refused with a status that says why,
// and changes nothing.
TEST_F(FailoverTest, DrainAndJoinRefuseWhatTheyCannotDo) {
  LocalClusterOptions o;
  o.config = CounterJob();
  o.config.cluster.num_servers = 1;
  o.config.fault_tolerance.replicas = 0;
  LocalCluster cluster(o);
  ASSERT_TRUE(cluster.Start().ok());
  proto::DrainRequest d;
  d.set_server(5);
  auto r = cluster.scheduler()->Drain(d);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  d.set_server(0);
  r = cluster.scheduler()->Drain(d);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition)
      << r.status();
  EXPECT_NE(r.status().message().find("only live server"),
            absl::string_view::npos)
      << r.status();
  auto st = cluster.scheduler()->Status();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->view().epoch(), cluster.view().epoch());
  EXPECT_EQ(st->view().routing().servers(0).state(), proto::NODE_ALIVE);
}

// Small synthetic job, 3 servers with 1 replica.
JobConfig TrainingJob(Mode mode) {
  JobConfig c;
  c.cluster.num_servers = 3;
  c.cluster.num_workers = 2;
  c.cluster.virtual_nodes = 16;
  c.cluster.heartbeat_ms = 100;
  c.cluster.heartbeat_timeout_ms = 60000;
  c.consistency.mode = mode;
  c.consistency.tau = 2;
  c.consistency.pull_timeout_ms = 60000;
  c.optimizer.name = "ftrl";
  c.optimizer.alpha = 0.5;
  c.optimizer.beta = 0.25;  // summed gradients of 250 rows (issue 12)
  c.optimizer.l1 = 0.25;
  c.optimizer.l2 = 0.25;
  c.data.format = "synthetic";
  c.data.synthetic.train_rows = 20000;
  c.data.synthetic.test_rows = 4000;
  c.data.synthetic.features = 10000;
  c.data.synthetic.seed = 11;
  c.training.minibatch = 250;
  c.training.epochs = 1;
  c.training.progress_interval_s = 1000;
  c.fault_tolerance.replicas = 1;
  return c;
}

double TestAuc(const std::string& report) {
  absl::StatusOr<double> auc = JsonNumber(report, "test_auc");
  return auc.ok() ? *auc : -1;
}

class FailoverModeTest : public FailoverTest,
                         public ::testing::WithParamInterface<std::string> {
 protected:
  Mode mode() const {
    return GetParam() == "bsp"   ? Mode::kBsp
           : GetParam() == "ssp" ? Mode::kSsp
                                 : Mode::kAsp;
  }
};

// Kill one of three servers a third of the way into training: the job ends
// ok, the failover is in the report with its recovery time, the test AUC
// is close to a run without the kill, and in BSP (deterministic) the model
// is the same.
TEST_P(FailoverModeTest, TrainingSurvivesAServerKill) {
  LocalClusterOptions clean;
  clean.config = TrainingJob(mode());
  LocalCluster reference(clean);
  ASSERT_TRUE(reference.Run().ok());
  const std::string ref_report = reference.ReportJson();

  LocalClusterOptions o;
  o.config = TrainingJob(mode());
  // 20000 rows / 250 per minibatch / 2 workers = 40 clocks a worker, each
  // about one push request per server.
  o.kill_servers.push_back({1, 80});
  LocalCluster cluster(o);
  absl::Status s = cluster.Run();
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_TRUE(cluster.server_killed(1));
  const std::string report = cluster.ReportJson();
  EXPECT_NE(report.find("\"status\": \"ok\""), std::string::npos) << report;
  EXPECT_TRUE(HasFailover(report, "S[1]")) << report;
  EXPECT_EQ(report.find("\"recovery_ms\": null"), std::string::npos) << report;
  ExpectAucLikeReference(TestAuc(report), TestAuc(ref_report), mode(),
                         report);
  absl::StatusOr<double> examples = JsonNumber(report, "examples");
  ASSERT_TRUE(examples.ok());
  EXPECT_EQ(*examples, 20000);
  if (mode() == Mode::kBsp) {
    auto a = reference.Snapshot();
    auto b = cluster.Snapshot();
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(a[i].first, b[i].first);
      EXPECT_NEAR(a[i].second[0], b[i].second[0], 1e-6) << "key " << a[i].first;
    }
  }
}

// Elasticity: a fourth server joins a fifth of the way in and S[1] is
// drained halfway: the job ends ok with every example once, both changes
// are in the report, and in BSP the model is the same as without them.
TEST_P(FailoverModeTest, TrainingSurvivesAJoinAndADrain) {
  LocalClusterOptions clean;
  clean.config = TrainingJob(mode());
  LocalCluster reference(clean);
  ASSERT_TRUE(reference.Run().ok());
  const std::string ref_report = reference.ReportJson();

  LocalClusterOptions o;
  o.config = TrainingJob(mode());
  o.spare_servers = 1;
  o.join_after_pushes = {50};
  o.drain_servers.push_back({1, 120});
  LocalCluster cluster(o);
  absl::Status s = cluster.Run();
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(cluster.join_status().size(), 1u);
  EXPECT_TRUE(cluster.join_status()[0].ok()) << cluster.join_status()[0];
  ASSERT_EQ(cluster.drain_status().size(), 1u);
  EXPECT_TRUE(cluster.drain_status()[0].ok()) << cluster.drain_status()[0];
  const std::string report = cluster.ReportJson();
  EXPECT_NE(report.find("\"status\": \"ok\""), std::string::npos) << report;
  EXPECT_TRUE(FindMembership(report, "joined", "S[3]").has_value()) << report;
  EXPECT_TRUE(FindMembership(report, "drained", "S[1]").has_value()) << report;
  EXPECT_TRUE(cluster.server(1)->OwnedRanges().empty());
  EXPECT_FALSE(cluster.server(3)->OwnedRanges().empty());
  ExpectAucLikeReference(TestAuc(report), TestAuc(ref_report), mode(),
                         report);
  absl::StatusOr<double> examples = JsonNumber(report, "examples");
  ASSERT_TRUE(examples.ok());
  EXPECT_EQ(*examples, 20000);
  if (mode() == Mode::kBsp) {
    auto a = reference.Snapshot();
    auto b = cluster.Snapshot();
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(a[i].first, b[i].first);
      EXPECT_NEAR(a[i].second[0], b[i].second[0], 1e-6) << "key " << a[i].first;
    }
  }
}

// Elasticity: a third worker joins the running job an eighth of the way
// in (and S[1] dies later, so its ranges fail over with the joiner in
// their clocks): the job ends ok with every example exactly once, the
// joiner trained its share from the clock the servers gave it, and the
// model is as good as without it.
TEST_P(FailoverModeTest, TrainingTakesAWorkerThatJoinsMidRun) {
  // 100 updates a worker rather than 40: with 40 the model is so early in
  // training that the order of updates alone moved the test AUC by up to
  // 0.015 under load.
  JobConfig job = TrainingJob(mode());
  job.training.minibatch = 100;
  LocalClusterOptions clean;
  clean.config = job;
  LocalCluster reference(clean);
  ASSERT_TRUE(reference.Run().ok());
  const std::string ref_report = reference.ReportJson();

  // 20000 rows / 100 / 2 workers = 100 clocks a worker, about 600 push
  // requests in all: the joiner comes an eighth of the way in, S[1] dies
  // at about 60%.
  LocalClusterOptions o;
  o.config = job;
  o.join_workers_after_pushes = {75};
  o.kill_servers.push_back({1, 375});
  LocalCluster cluster(o);
  absl::Status s = cluster.Run();
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(cluster.joined_workers().size(), 1u);
  EXPECT_EQ(cluster.joined_workers()[0].first, 2);
  EXPECT_TRUE(cluster.joined_workers()[0].second.ok())
      << cluster.joined_workers()[0].second;
  const std::string report = cluster.ReportJson();
  EXPECT_NE(report.find("\"status\": \"ok\""), std::string::npos) << report;
  const std::optional<proto::JobReport::MembershipChange> joined =
      FindMembership(report, "joined", "W[2]");
  ASSERT_TRUE(joined.has_value()) << report;
  ASSERT_TRUE(joined->has_start_clock()) << report;
  EXPECT_GT(joined->start_clock(), 0) << report;  // the others had clocks
  ASSERT_TRUE(joined->has_units()) << report;
  EXPECT_GT(joined->units(), 0) << report;
  absl::StatusOr<double> examples = JsonNumber(report, "examples");
  ASSERT_TRUE(examples.ok());
  EXPECT_EQ(*examples, 20000);
  // The per-worker results: W[2] trained rows.
  const std::optional<proto::JobReport::Worker> w2 = FindWorker(report, 2);
  ASSERT_TRUE(w2.has_value()) << report;
  EXPECT_GT(w2->examples(), 0) << report;
  // Three workers from the join on update in another order than the
  // reference's two (any mode): the model is not the same, only no worse.
  // BSP makes fewer, larger steps with three (0.004-0.007 below the
  // reference); in 20 runs each, four at once, ASP ranged from 0.0085 below to
  // 0.0023 above and SSP from 0.007 below to 0.0012 above.
  EXPECT_GE(TestAuc(report), TestAuc(ref_report) - 0.02) << report;
}

INSTANTIATE_TEST_SUITE_P(Modes, FailoverModeTest,
                         ::testing::Values("bsp", "ssp", "asp"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace ps
