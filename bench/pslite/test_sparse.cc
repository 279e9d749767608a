// The sparse half of the side-by-side with ps-lite (issue 10), written for
// ps-lite: NOT built by this project (see bench/pslite/test_latency.cc for how
// to build and run one of these in a ps-lite checkout; this one as
// tests/test_sparse, arguments K MODE SECONDS IN_FLIGHT, e.g.
//   tests/local.sh 1 1 tests/test_sparse 100000 0 3 4).
// Upstream's tests/test_kv_app_benchmark pushes 10M keys once; this one is
// steady state like pushpull_bench --cases=sparse: two fixed lists of K random
// keys alternated (one float each), IN_FLIGHT requests outstanding, for
// SECONDS after a 1 s warm-up; prints M keys/s.
// The server's handler does nothing but answer (as upstream's
// test_kv_app_benchmark's EmptyHandler): a push is not stored, a pull is
// answered with zeros.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <deque>
#include <random>
#include <vector>
#include "ps/ps.h"
using namespace ps;
void Handler(const KVMeta& m, const KVPairs<float>& d, KVServer<float>* s) {
  KVPairs<float> res;
  if (!m.push) {
    res.keys = d.keys;
    res.vals.resize(d.keys.size());
  }
  s->Response(m, res);
}
int main(int argc, char* argv[]) {
  const int k = argc > 1 ? atoi(argv[1]) : 100000;
  const int mode = argc > 2 ? atoi(argv[2]) : 0;  // 0 push, 1 pull
  const double seconds = argc > 3 ? atof(argv[3]) : 3;
  const int inflight = argc > 4 ? atoi(argv[4]) : 4;
  Start(0);
  KVServer<float>* server = nullptr;
  if (IsServer()) {
    server = new KVServer<float>(0);
    server->set_request_handle(Handler);
  }
  if (IsWorker()) {
    KVWorker<float> kv(0, 0);
    // Two fixed key lists, alternated (as pushpull_bench's sparse case).
    std::vector<SArray<Key>> lists(2);
    std::mt19937_64 rng(7);
    for (auto& l : lists) {
      std::vector<Key> v(k);
      for (auto& x : v) x = rng() % kMaxKey;
      std::sort(v.begin(), v.end());
      v.erase(std::unique(v.begin(), v.end()), v.end());
      l.CopyFrom(v.data(), v.size());
    }
    SArray<float> vals(k, 0.5f);
    std::vector<SArray<float>> outs(inflight);
    std::deque<int> ts;
    long keys_done = 0;
    int n = 0;
    auto issue = [&](int slot) {
      const SArray<Key>& l = lists[n++ % 2];
      SArray<float> v(vals.data(), l.size(), false);
      return mode == 0 ? kv.ZPush(l, v) : kv.ZPull(l, &outs[slot]);
    };
    auto run = [&](double secs, bool count) {
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < inflight; ++i) ts.push_back(issue(i));
      int slot = 0;
      for (;;) {
        kv.Wait(ts.front());
        ts.pop_front();
        if (count) keys_done += lists[0].size();
        double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (el >= secs) break;
        ts.push_back(issue(slot++ % inflight));
      }
      while (!ts.empty()) { kv.Wait(ts.front()); ts.pop_front(); }
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    };
    run(1.0, false);
    double el = run(seconds, true);
    printf("SPARSE %s %d keys x %d in flight: %.1f M keys/s\n", mode == 0 ? "push" : "pull",
           k, inflight, keys_done / el / 1e6);
    fflush(stdout);
  }
  Finalize(0, true);
  delete server;
  return 0;
}
