// The latency half of the side-by-side with ps-lite (issue 10), written for
// ps-lite: NOT built by this project (it needs a ps-lite checkout; see
// ../shared/peers/ps-lite.md and docs/benchmarks.md). Copy it into a ps-lite
// checkout as tests/test_latency.cc, then
//   make tests/test_latency DEPS_PATH=/usr PROTOC=protoc -f Makefile -f tests/test.mk
//   DMLC_NODE_HOST=127.0.0.1 DMLC_PS_ROOT_URI=127.0.0.1 \
//     tests/local.sh 1 1 tests/test_latency 20000 MODE   # MODE 0 push, 1 pull
// One worker pushes (or pulls) one key of 1024 floats (4 KiB) and waits for
// the answer, 1000 warm-up round trips then N measured; it prints p50 and p99
// in microseconds. The server stores a push (a copy into its map) and answers
// a pull with the stored value. Ours (pushpull_bench --cases=latency) moves
// the same 4 KiB of values as 1024 keys of a dim-1 table (plus their 8 KiB
// of keys) through the real server (SGD), so it carries more per request.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <unordered_map>
#include <vector>
#include "ps/ps.h"
using namespace ps;
std::unordered_map<Key, std::vector<float>> store;
void Handler(const KVMeta& m, const KVPairs<float>& d, KVServer<float>* s) {
  KVPairs<float> res;
  if (m.push) {
    size_t len = d.vals.size() / d.keys.size();
    for (size_t i = 0; i < d.keys.size(); ++i)
      store[d.keys[i]].assign(d.vals.data() + i * len, d.vals.data() + (i + 1) * len);
  } else {
    res.keys = d.keys;
    for (size_t i = 0; i < d.keys.size(); ++i) {
      auto& v = store[d.keys[i]];
      if (v.empty()) v.resize(1024);
      for (float x : v) res.vals.push_back(x);
    }
    res.lens.push_back(1024);
  }
  s->Response(m, res);
}
int main(int argc, char* argv[]) {
  int n = argc > 1 ? atoi(argv[1]) : 20000;
  int mode = argc > 2 ? atoi(argv[2]) : 0;  // 0 push, 1 pull
  Start(0);
  KVServer<float>* server = nullptr;
  if (IsServer()) {
    server = new KVServer<float>(0);
    server->set_request_handle(Handler);
  }
  if (IsWorker()) {
    KVWorker<float> kv(0, 0);
    std::vector<Key> keys = {kMaxKey / 2};
    std::vector<float> vals(1024, 1.0f);
    std::vector<int> lens = {1024};
    std::vector<float> out;
    std::vector<double> lat;
    for (int i = 0; i < n + 1000; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      if (mode == 0) kv.Wait(kv.Push(keys, vals, lens));
      else kv.Wait(kv.Pull(keys, &out));
      auto t1 = std::chrono::steady_clock::now();
      if (i >= 1000) lat.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    }
    std::sort(lat.begin(), lat.end());
    printf("LATENCY %s p50 %.1f us p99 %.1f us (%zu round trips)\n", mode == 0 ? "push" : "pull",
           lat[lat.size() / 2], lat[lat.size() * 99 / 100], lat.size());
    fflush(stdout);
  }
  Finalize(0, true);
  delete server;
  return 0;
}
