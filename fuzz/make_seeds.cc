// Writes the binary seed inputs of fuzz_server and fuzz_scheduler (small,
// valid call sequences of a two-worker job) into fuzz/corpus/<target>/.
// Usage: fuzz_make_seeds <fuzz/corpus dir>. The text corpora (libsvm,
// criteo, config) are plain files copied from real data and configs.
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <sstream>

#include <zlib.h>

#include "common/bytes.h"
#include "common/config.h"
#include "server/checkpoint.h"
#include "scheduler/state_file.h"
#include "server/table.h"
#include "common/routing.h"
#include "common/value_codec.h"
#include "fuzz/fuzz_input.pb.h"

namespace ps::fuzz {
namespace {

std::string Keys(std::vector<uint64_t> k) {
  std::string s;
  PackTo<uint64_t>(&s, k);
  return s;
}
std::string Vals(std::vector<float> v) {
  std::string s;
  PackTo<float>(&s, v);
  return s;
}

void Write(const std::string& path, const google::protobuf::Message& m) {
  std::ofstream f(path, std::ios::binary);
  f << m.SerializeAsString();
  std::printf("%s (%zu bytes)\n", path.c_str(), m.ByteSizeLong());
}

void WriteRaw(const std::string& path, const std::string& bytes) {
  std::filesystem::create_directories(
      std::filesystem::path(path).parent_path());
  std::ofstream f(path, std::ios::binary);
  f << bytes;
  std::printf("%s (%zu bytes)\n", path.c_str(), bytes.size());
}

// Two workers push, clock and pull for `clocks` clocks, then finish.
// `encoding` / `codec` (issue 10): the pushes' values travel so.
ServerInput ServerJob(proto::ConsistencyMode mode, int clocks,
                      proto::ValueEncoding encoding = proto::VALUES_F32,
                      proto::ValueCodec codec = proto::CODEC_NONE) {
  ServerInput in;
  in.set_servers(0);  // 1 server
  in.set_workers(1);  // 2 workers
  in.set_mode(mode);
  in.set_tau(1);
  for (int c = 0; c < clocks; ++c) {
    for (int w = 0; w < 2; ++w) {
      proto::PullRequest* pull = in.add_calls()->mutable_pull();
      pull->set_worker_id(w);
      pull->set_clock(c);
      pull->set_epoch(1);
      pull->set_table(c % 2);
      pull->set_keys(Keys({1, 7, 42}));
      pull->set_wait_ms(1000);
      proto::PushRequest* push = in.add_calls()->mutable_push();
      push->set_worker_id(w);
      push->set_seq(c + 1);
      push->set_clock(c);
      push->set_epoch(1);
      push->set_table(0);
      push->set_keys(Keys({1, 7, 42}));
      push->set_num_examples(4);
      const std::vector<float> g = {0.5f, -1.0f, 2.0f, 0.0f, 0.0f, 0.0f,
                                    0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
      if (encoding == proto::VALUES_F32 && codec == proto::CODEC_NONE) {
        push->set_vals(Vals({0.5f, -1.0f, 2.0f}));
      } else {
        // 12 keys, most of them zero: something for a codec to squeeze.
        push->set_keys(Keys({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 42}));
        std::string v;
        const float scale = Int8Scale(g.data(), g.size());
        EncodeValues(encoding, g.data(), g.size(), scale, &v, nullptr);
        push->set_value_encoding(encoding);
        proto::PushSegment* seg = push->add_segments();
        // The range of the small keys on fuzz_server's ring (one server,
        // 4 virtual nodes).
        seg->set_range(Routing::FromProto(BuildHashRing({0}, 4, 1))->RangeOf(1));
        seg->set_seq(c + 1);
        seg->set_num_keys(12);
        seg->set_scale(scale);
        std::string packed;
        if (Compress(codec, v, &packed)) {
          push->set_vals_codec(codec);
          push->set_vals_raw_bytes(v.size());
          v = packed;
        }
        push->set_vals(v);
      }
      proto::ClockRequest* clock = in.add_calls()->mutable_clock();
      clock->set_worker_id(w);
      clock->set_clock(c);
      clock->set_epoch(1);
      clock->set_pushes(1);
      clock->set_num_examples(4);
      clock->set_settled_seq(c);
    }
    in.add_calls()->set_advance_ms(20);
  }
  for (int w = 0; w < 2; ++w) {
    proto::FinishRequest* f = in.add_calls()->mutable_finish();
    f->set_worker_id(w);
    f->set_final_clock(clocks);
  }
  return in;
}

// One server and two workers register, heartbeat, get shards, meet at a
// barrier, open sessions (one closes) and report done.
SchedulerInput SchedulerJob(bool switch_mode) {
  SchedulerInput in;
  in.set_servers(0);
  in.set_workers(1);
  proto::RegisterRequest* r = in.add_calls()->mutable_register_();
  r->set_role(proto::ROLE_SERVER);
  r->set_address("inproc:server:0");
  r->set_requested_id(-1);
  for (int w = 0; w < 2; ++w) {
    r = in.add_calls()->mutable_register_();
    r->set_role(proto::ROLE_WORKER);
    r->set_requested_id(w);
  }
  in.add_calls()->mutable_get_view()->set_known_epoch(0);
  for (int w = 0; w < 2; ++w) {
    in.add_calls()->mutable_get_work()->set_worker_id(w);
    proto::HeartbeatRequest* h = in.add_calls()->mutable_heartbeat();
    h->set_role(proto::ROLE_WORKER);
    h->set_id(w);
    h->set_clock(1);
    proto::BarrierRequest* b = in.add_calls()->mutable_barrier();
    b->set_name("start");
    b->set_role(proto::ROLE_WORKER);
    b->set_id(w);
  }
  // Sessions (issue 9): both workers open one; W[1]'s closes.
  for (int w = 0; w < 2; ++w) {
    proto::SessionRequest* o = in.add_calls()->mutable_open_session();
    o->set_role(proto::ROLE_WORKER);
    o->set_id(w);
  }
  proto::SessionRequest* c = in.add_calls()->mutable_close_session();
  c->set_role(proto::ROLE_WORKER);
  c->set_id(1);
  in.add_calls()->set_advance_ms(600);
  if (switch_mode) {
    proto::SetConsistencyRequest* s =
        in.add_calls()->mutable_set_consistency();
    s->mutable_consistency()->set_mode(proto::MODE_SSP);
    s->mutable_consistency()->set_tau(2);
  }
  for (int w = 0; w < 2; ++w) {
    proto::WorkerDoneRequest* d = in.add_calls()->mutable_worker_done();
    d->set_worker_id(w);
    d->set_examples(100);
    d->set_has_eval(w == 0);
    d->set_test_auc(0.8);
  }
  return in;
}

// S[0] as the BSP backup of S[1]'s ranges (2 servers, 1 worker, 1
// replica): the ring both jobs below use, and the job that sends S[0]
// `req` (from S[1] at epoch 1) twice, the second a resend.
const proto::RoutingTable& BackupRing() {
  static const proto::RoutingTable ring = BuildHashRing({0, 1}, 4, 1, 1);
  return ring;
}
ServerInput BackupJobSending(proto::ReplicateRequest req) {
  ServerInput in;
  in.set_servers(1);  // 2 servers
  in.set_workers(0);  // 1 worker
  in.set_replicas(1);
  in.set_mode(proto::MODE_BSP);
  req.set_from_server(1);
  req.set_epoch(1);
  *in.add_calls()->mutable_replicate() = req;
  *in.add_calls()->mutable_replicate() = req;
  return in;
}

// Issue 9: S[1]'s log: a push to one range, then a clock's announcements
// for all of them in one entry.
ServerInput BackupJob() {
  const proto::RoutingTable& ring = BackupRing();
  std::vector<int> theirs;
  for (int r = 0; r < ring.range_server_size(); ++r) {
    if (ring.range_server(r) == 1) theirs.push_back(r);
  }
  const Routing routing = *Routing::FromProto(ring);
  proto::ReplicateRequest req;
  if (!theirs.empty()) {
    const int r = theirs[0];
    proto::ReplicaPush* p = req.add_entries()->mutable_push();
    p->set_worker(0);
    p->set_clock(0);
    p->set_table(0);
    p->set_num_examples(1);
    p->set_keys(Keys({routing.RangeBegin(r)}));
    p->set_vals(Vals({0.5f}));
    p->add_seg_ranges(r);
    p->add_seg_indexes(1);
    p->add_seg_seqs(1);
    p->add_seg_num_keys(1);
  }
  proto::ReplicaAnnounces* a = req.add_entries()->mutable_announces();
  a->set_worker(0);
  a->set_clock(0);
  a->set_examples(1);
  for (size_t i = 0; i < theirs.size(); ++i) {
    a->add_ranges(theirs[i]);
    a->add_indexes(i == 0 ? 2 : 1);
    a->add_segments(i == 0 ? 1 : 0);
    a->add_settled_seqs(0);
  }
  return BackupJobSending(std::move(req));
}

// Replication after aggregation: one applied clock of one range of S[1]
// (its segment ids, the announcement that completed it, the summed
// gradients).
ServerInput BackupBspJob() {
  const proto::RoutingTable& ring = BackupRing();
  const Routing routing = *Routing::FromProto(ring);
  proto::ReplicateRequest req;
  for (int r = 0; r < ring.range_server_size(); ++r) {
    if (ring.range_server(r) != 1) continue;
    proto::ReplicaBspClocks* c = req.add_entries()->mutable_bsp();
    c->add_ranges(r);
    c->add_indexes(1);
    c->add_clocks(0);
    c->add_examples(1);
    c->add_num_segs(1);
    c->add_num_anns(1);
    c->add_num_sums(1);
    c->add_seg_workers(0);
    c->add_seg_seqs(1);
    c->add_ann_workers(0);
    c->add_ann_segments(1);
    c->add_ann_examples(1);
    c->add_ann_settled(0);
    c->add_sum_tables(0);
    c->add_sum_num_keys(1);
    *c->mutable_sum_keys() = Keys({routing.RangeBegin(r)});
    *c->mutable_sum_vals() = Vals({0.5f});
    break;
  }
  return BackupJobSending(std::move(req));
}

// ServerJob's job on the tables of fuzz_server's variant `tables`
// (server_fuzz.cc, VariantOf), with table 1's keys pushed and pulled too,
// the second time by a key list the server caches (key_list, num_keys).
ServerInput TablesJob(proto::ConsistencyMode mode, uint32_t tables) {
  ServerInput in = ServerJob(mode, 2);
  in.set_tables(tables);
  // ServerJob's last calls are the workers' finishes: clock 2 first.
  in.mutable_calls()->RemoveLast();
  in.mutable_calls()->RemoveLast();
  const bool long_rows = (tables & 4) != 0;
  const int dim1 = long_rows ? 300 : 3;
  // Keys in the dense-id layout when it has one (below 4096), and above it.
  // Long rows: one key, by worker 0 only, to stay within the fuzzers'
  // -max_len (deploy/check.sh).
  const std::vector<uint64_t> keys1 =
      long_rows ? std::vector<uint64_t>{5000}
                : std::vector<uint64_t>{3, 9, 4000, 5000, 123456789};
  const std::string keys = Keys(keys1);
  const uint32_t n1 = static_cast<uint32_t>(keys1.size());
  for (int w = 0; w < 2; ++w) {
    for (int round = 0; round < (long_rows && w == 1 ? 0 : 2); ++round) {
      proto::PushRequest* push = in.add_calls()->mutable_push();
      push->set_worker_id(w);
      push->set_seq(10 + round);
      push->set_clock(2);
      push->set_epoch(1);
      push->set_table(1);
      push->set_key_list(77 + w);
      push->set_key_lists(2);
      if (round == 0) {
        push->set_keys(keys);
      } else {
        push->set_num_keys(n1);
      }
      std::vector<float> g(n1 * dim1);
      for (size_t i = 0; i < g.size(); ++i) g[i] = 0.25f * (i % 7) - 0.5f;
      push->set_vals(Vals(g));
      proto::PullRequest* pull = in.add_calls()->mutable_pull();
      pull->set_worker_id(w);
      pull->set_clock(2);
      pull->set_epoch(1);
      pull->set_table(1);
      pull->set_key_list(77 + w);
      pull->set_num_keys(n1);
      pull->set_wait_ms(1000);
    }
    // Table 0 (dim 1) with 20 keys: FTRL's vector lanes take 16 at a time.
    proto::PushRequest* push = in.add_calls()->mutable_push();
    push->set_worker_id(w);
    push->set_seq(12);
    push->set_clock(2);
    push->set_epoch(1);
    push->set_table(0);
    std::vector<uint64_t> many;
    std::vector<float> g;
    for (int k = 0; k < 20; ++k) {
      many.push_back(100 + 37 * k);
      g.push_back(0.125f * (k % 5) - 0.25f);
    }
    push->set_keys(Keys(many));
    push->set_vals(Vals(g));
    proto::ClockRequest* clock = in.add_calls()->mutable_clock();
    clock->set_worker_id(w);
    clock->set_clock(2);
    clock->set_epoch(1);
    clock->set_pushes(long_rows && w == 1 ? 1 : 3);
    clock->set_num_examples(4);
    clock->set_settled_seq(2);
  }
  in.add_calls()->set_advance_ms(20);
  for (int w = 0; w < 2; ++w) {
    proto::FinishRequest* f = in.add_calls()->mutable_finish();
    f->set_worker_id(w);
    f->set_final_clock(3);
  }
  return in;
}

// fuzz_files seeds: byte 0 (the reader, with the CRC fix-up bit 0x10
// where set), then the file.
std::string ReadBytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void WriteFileSeeds(const std::string& dir) {
  char tmp[] = "/tmp/ps_make_seeds_XXXXXX";
  if (::mkdtemp(tmp) == nullptr) return;
  TableSpec spec;
  spec.dim = 1;
  spec.optimizer.name = "ftrl";
  spec.optimizer.alpha = 0.1;
  spec.optimizer.beta = 1;
  const int ranges = Routing::FromProto(BuildHashRing({0}, 4, 1))->num_ranges();
  auto table = Table::Create(spec, ranges);
  if (!table.ok()) return;
  auto routing = Routing::FromProto(BuildHashRing({0}, 4, 1));
  std::vector<uint64_t> keys = {3, 9, 4000, 5000, 123456789,
                                uint64_t{1} << 63, ~uint64_t{0}};
  for (uint64_t k : keys) {
    const float g = 0.5f;
    (*table)->Push(routing->RangeOf(k), absl::MakeConstSpan(&k, 1), &g, 1.0f);
  }
  std::vector<int> all;
  for (int r = 0; r < ranges; ++r) all.push_back(r);
  proto::CheckpointHeader h;
  h.set_checkpoint_id(1);
  h.set_server_id(0);
  h.set_num_ranges(ranges);
  proto::CheckpointFileInfo info;
  if (WriteCheckpointFile(tmp, **table, all, h, &info).ok()) {
    const std::string ckpt =
        ReadBytes(std::string(tmp) + "/" + CheckpointFileName(0, 0));
    WriteRaw(dir + "/files/checkpoint", std::string(1, '\0') + ckpt);
    WriteRaw(dir + "/files/checkpoint_dense_fixcrc",
             std::string(1, '\x30') + ckpt);
  }
  size_t written = 0;
  const std::string bin = std::string(tmp) + "/table.bin";
  if ((*table)->SaveBinary(bin, &written).ok()) {
    WriteRaw(dir + "/files/table_bin", std::string(1, '\2') + ReadBytes(bin));
  }
  // A state file with 64-byte slots: slot 0 holds "state", slot 1 nothing.
  std::string state(StateFile::kHeaderBytes, '\0');
  std::memcpy(state.data(), "PSSCHST2", 8);
  const uint64_t capacity = 64;
  std::memcpy(state.data() + 8, &capacity, 8);
  std::string slot(StateFile::kSlotHeaderBytes, '\0');
  const uint64_t seq = 1, len = 5;
  std::memcpy(slot.data(), &seq, 8);
  std::memcpy(slot.data() + 8, &len, 8);
  slot += "state";
  uLong crc = ::crc32(0L, reinterpret_cast<const Bytef*>(slot.data()), 16);
  crc = ::crc32(crc, reinterpret_cast<const Bytef*>(slot.data() + 20), 5);
  const uint32_t c = static_cast<uint32_t>(crc);
  std::memcpy(slot.data() + 16, &c, 4);
  state += slot;
  WriteRaw(dir + "/files/state", std::string(1, '\1') + state);
  WriteRaw(dir + "/files/state_fixcrc", std::string(1, '\x11') + state);
  std::filesystem::remove_all(tmp);
}

}  // namespace
}  // namespace ps::fuzz

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <fuzz/corpus dir>\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  using ps::fuzz::ServerJob;
  ps::fuzz::Write(dir + "/server/bsp_2clocks", ServerJob(ps::proto::MODE_BSP, 2));
  ps::fuzz::Write(dir + "/server/ssp_3clocks", ServerJob(ps::proto::MODE_SSP, 3));
  ps::fuzz::Write(dir + "/server/asp_1clock", ServerJob(ps::proto::MODE_ASP, 1));
  ps::fuzz::Write(dir + "/server/asp_int8_zstd",
                  ServerJob(ps::proto::MODE_ASP, 2, ps::proto::VALUES_INT8,
                            ps::proto::CODEC_ZSTD));
  ps::fuzz::Write(dir + "/server/bsp_f16_lz4",
                  ServerJob(ps::proto::MODE_BSP, 2, ps::proto::VALUES_F16,
                            ps::proto::CODEC_LZ4));
  using ps::fuzz::TablesJob;
  ps::fuzz::Write(dir + "/server/ftrl_adam_cached",
                  TablesJob(ps::proto::MODE_ASP, 1));
  ps::fuzz::Write(dir + "/server/adagrad_ftrl_dense_ids",
                  TablesJob(ps::proto::MODE_SSP, 2 | 8));
  ps::fuzz::Write(dir + "/server/adam_sgd_long_rows",
                  TablesJob(ps::proto::MODE_BSP, 3 | 4));
  ps::fuzz::Write(dir + "/server/backup_replicate", ps::fuzz::BackupJob());
  ps::fuzz::Write(dir + "/server/backup_bsp_clock", ps::fuzz::BackupBspJob());
  ps::fuzz::Write(dir + "/scheduler/job", ps::fuzz::SchedulerJob(false));
  ps::fuzz::WriteFileSeeds(dir);
  ps::fuzz::Write(dir + "/scheduler/job_set_ssp", ps::fuzz::SchedulerJob(true));
  return 0;
}
