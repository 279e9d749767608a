// The job configuration: one YAML file per job, every field with a default,
// single fields overridable from the command line (`--set a.b=value`).
//
// Errors name the field: an unknown key, a value of the wrong type, or a
// value out of range makes Parse/Override fail with INVALID_ARGUMENT and a
// message like "config field training.minibatch: must be >= 1, got 0".
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/ps.pb.h"

namespace ps {

struct ClusterConfig {
  std::string scheduler = "127.0.0.1:0";  // host:port (0: launcher picks)
  int num_servers = 2;
  int num_workers = 2;
  int virtual_nodes = 64;
  int heartbeat_ms = 500;
  int heartbeat_timeout_ms = 10000;  // a node silent this long is dead
  // How long servers and workers go on without an answer from the
  // scheduler before they give up (issue 9): a restarted scheduler (a pod
  // rescheduled, `ps_launch --kill H --restart=DELAY`) may take longer than
  // a heartbeat timeout to come back, and training does not need it
  // meanwhile. Never less than heartbeat_timeout_ms (SchedulerTimeout).
  int scheduler_timeout_ms = 60000;
  int register_timeout_ms = 60000;   // waiting for all nodes to register
  std::string auth_token;  // when set, every RPC must carry it
  std::string bind_host = "127.0.0.1";  // interface servers listen on

  // ---- Limits, TLS (issue 8: security) ----
  // Largest gRPC message any process sends or accepts, MiB (1..2047). The
  // largest push of the shipped configs is under 1 MiB.
  int max_message_mb = 64;
  // Key caching (issue 10; the paper's section 4.2): workers send a key list
  // a server already keeps by name (8 bytes per key saved, and the server
  // skips its hash lookups). Servers keep at most 256 MiB of lists (least
  // recently used go first). false: every request carries its keys.
  bool key_caching = true;
  // Issue 10: workers push, pull and clock over each server's data plane
  // (a plain TCP connection beside gRPC, transport/data_plane.h) instead
  // of gRPC. Never with TLS (the data plane has none: gRPC carries them).
  bool data_plane = true;
  // With the data plane: a worker or server reaches a server on the same
  // host (in the same network namespace) over that server's abstract
  // Unix-domain socket instead of loopback TCP: the same frames at about
  // half the CPU per byte. A server elsewhere is reached over TCP as
  // before. false: always TCP.
  bool local_socket = true;
  // With a same-host socket: the shared memory (a sealed memfd) a worker
  // offers each server for values of 64 KiB or more, written once there
  // instead of copied through the kernel twice (transport/shared_arena.h).
  // Touched only as far as requests in flight need it. 0: none.
  int shared_memory_mb = 128;
  // gRPC TLS when cert_file or ca_file is set (PEM files; relative paths as
  // given). Servers and the scheduler present cert_file/key_file; clients
  // verify them against ca_file; with require_client_cert every process
  // also presents cert_file/key_file and servers refuse clients without one
  // (mutual TLS). Certificates must name the addresses nodes are reached at
  // (subjectAltName IP/DNS).
  struct Tls {
    std::string cert_file;
    std::string key_file;
    std::string ca_file;
    bool require_client_cert = false;
    bool operator==(const Tls&) const = default;
  };
  Tls tls;
  // ---- end of limits, TLS ----

  bool operator==(const ClusterConfig&) const = default;

  // scheduler_timeout_ms, or the heartbeat timeout when that is longer.
  absl::Duration SchedulerTimeout() const {
    return absl::Milliseconds(
        std::max(scheduler_timeout_ms, heartbeat_timeout_ms));
  }
  // Failover (issue 9): a push or clock (on a worker) or a replication
  // batch (on a primary) left unanswered this long makes its server a
  // suspect, which the scheduler probes: four heartbeats, at least 2 s.
  // Pushes, clocks and replication batches are answered once applied and
  // replicated, never held by a consistency wait, so such silence means a
  // hung server, not a slow clock.
  absl::Duration SuspectAfter() const {
    return std::max(absl::Milliseconds(4 * int64_t{heartbeat_ms}),
                    absl::Seconds(2));
  }
  // Worker failure (issue 9): a worker whose data-plane connection a
  // server saw closed after its last heartbeat is dead once it has been
  // silent this long (six heartbeats, at least 3 s; never more than the
  // heartbeat timeout): its process is gone, and BSP and SSP stop waiting
  // for it seconds sooner than heartbeat_timeout_ms.
  absl::Duration WorkerGoneAfter() const {
    return std::min(
        std::max(absl::Milliseconds(6 * int64_t{heartbeat_ms}),
                 absl::Seconds(3)),
        absl::Milliseconds(heartbeat_timeout_ms));
  }
};

enum class Mode { kBsp, kSsp, kAsp };

struct ConsistencyConfig {
  Mode mode = Mode::kSsp;
  int64_t tau = 4;                // ignored for bsp (0) and asp (infinity)
  int64_t pull_timeout_ms = 120000;  // a consistency wait gives up after this

  bool operator==(const ConsistencyConfig&) const = default;
};

// training.minibatch, training.epochs and optimizer.feature_scale: auto
// (issue 12). Resolved by the scheduler (ResolveAutoMinibatch,
// ResolveAutoEpochs, ResolveFeatureScale) before any other process sees the
// config.
inline constexpr int kAutoMinibatch = 0;
inline constexpr int kAutoEpochs = 0;
inline constexpr double kAutoFeatureScale = 0;

struct OptimizerConfig {
  std::string name = "ftrl";  // sgd | adagrad | ftrl | adam
  // Units (issue 12: one meaning whatever the minibatch, worker count and
  // consistency mode). An update is one worker's minibatch in SSP and ASP,
  // and all workers' rows of a clock in BSP (one aggregated update a clock).
  // - ftrl works on each update's SUMMED gradient, so its state after a set
  //   of examples does not depend on how they were grouped into updates:
  //   l1, l2 and the hidden L2 beta/alpha weigh against the summed loss of
  //   the examples trained on (as LIBLINEAR's 1/C does: l2 = 1/C).
  // - sgd, adagrad and adam work on each update's MEAN gradient:
  //   learning_rate is a step per update, and l1/l2 weigh against the mean
  //   loss (regularisation per example), whatever the update's size.
  double learning_rate = 0.1;  // sgd, adagrad, adam: step size per update
  // FTRL-Proximal (McMahan et al. 2013): per-coordinate step
  // alpha / (beta + sqrt(sum of squared gradients)); beta/alpha also acts
  // as an L2 of that size. The defaults reach LIBLINEAR's AUC within 0.01
  // on a9a, news20 and criteo-10k in every mode (docs/lr_benchmark.md).
  double alpha = 0.5;          // ftrl
  double beta = 32;            // ftrl
  double l1 = 0.03;            // ftrl, sgd, adagrad (units above)
  double l2 = 0.03;            // every rule (units above)
  double initial_accumulator = 0.1;  // adagrad: starting sum of squares
  // ftrl: alpha, beta, l1 and l2 are meant for features whose values are
  // about 1 in size. The servers use alpha / s, beta * s, l1 * s and
  // l2 * s^2 (the same model as with every value divided by s), where s is
  // this field (> 0), or, with `auto` (kAutoFeatureScale, the default), the
  // mean |value| of the features in the training file's first 64 KiB (1
  // for criteo and synthetic data). The scheduler applies and logs it
  // (ResolveDataDefaults in scheduler/scheduler.cc), then records s = 1.
  // Other optimizers ignore it.
  double feature_scale = kAutoFeatureScale;

  bool operator==(const OptimizerConfig&) const = default;
};

struct SyntheticConfig {
  int64_t train_rows = 200000;
  int64_t test_rows = 20000;
  int64_t features = 100000;
  int nnz_per_row = 20;
  double zipf_exponent = 1.1;  // power-law feature popularity
  double true_sparsity = 0.1;  // share of features with a non-zero true weight
  double label_noise = 0.0;    // share of labels flipped
  uint64_t seed = 1;
  bool operator==(const SyntheticConfig&) const = default;
};

struct DataConfig {
  std::string format = "synthetic";  // synthetic | libsvm | criteo
  std::string train;                 // path (libsvm, criteo)
  std::string test;
  bool skip_malformed = false;  // false: a malformed line is an error
  // Training rows are read in a new seeded order every epoch (seed:
  // training.seed): the scheduler hands each epoch's work units out in a
  // seeded order (which worker trains which unit changes every epoch), and
  // a worker reads a unit's byte blocks (1 MiB) in a seeded order through a
  // shuffle buffer of shuffle_buffer_rows rows (synthetic rows: a full
  // permutation of the unit; the mlp model's criteo field rows: the unit,
  // in file order, through the same kind of buffer). Reproducible for a seed (a BSP run is
  // bit-identical), whatever the timing. false: file order, every epoch the
  // same, as before shuffling existed: for data that is already shuffled
  // (saves the buffer's copy) or whose order matters (time-ordered data),
  // and to compare with runs made before.
  bool shuffle = true;
  // Rows (parsed) the shuffle buffer of each open unit holds, >= 1: about 2x
  // this many rows of memory per worker (a9a rows: ~200 B, criteo ~500 B).
  // A unit smaller than the buffer (the default: units hold about ten
  // minibatches, fault_tolerance.work_unit_rows `auto`) is shuffled whole;
  // the test set is never shuffled.
  int64_t shuffle_buffer_rows = 10000;
  // Share of the training rows held out for validation, in [0, 0.5]: a row
  // is held out when a seeded hash of its content (label, features and
  // values; seed: training.seed) falls below this share, so the split is
  // the same whatever the sharding, shuffling and worker count, and equal
  // rows land on the same side. Held-out rows are never trained on; the
  // evaluating worker reports validation AUC and log loss
  // (validation_auc, validation_logloss in the report), the progress line
  // shows the latest, and training.early_stopping and `ps_launch --tune`
  // use them (--tune: logistic_regression only). 0 (the default): no
  // validation split. Both models (mlp: the hash of the field row's label
  // and keys).
  double validation_fraction = 0;
  SyntheticConfig synthetic;

  bool operator==(const DataConfig&) const = default;
};


struct TrainingConfig {
  std::string model = "logistic_regression";
  // Rows per update (per worker, per clock), >= 1, or `auto`
  // (kAutoMinibatch, the default): sized from the training rows the
  // scheduler estimates so that each worker makes about
  // kAutoUpdatesPerEpoch updates per epoch, clamped to [24, 1000] (100 when
  // the scheduler cannot see the data). A worker with fewer than 50
  // updates in its first epoch logs a warning (kFewUpdatesPerEpoch).
  int minibatch = kAutoMinibatch;
  // Passes over the training data, >= 1, or `auto` (kAutoEpochs, the
  // default): 100000 / rows rounded up, within [1, 3] (1 when the scheduler
  // cannot see the data), so small data sets get a few passes.
  int epochs = kAutoEpochs;
  int threads = 1;  // gradient threads per worker
  std::string backend = "cpu";  // cpu | cuda | auto
  double progress_interval_s = 2.0;
  // Seeds the order training rows are read in (data.shuffle) and the mlp
  // model's dropout masks; any value, 0 included.
  uint64_t seed = 1;
  double straggler_factor = 1.0;  // worker 0 is made this many times slower
  // Worker 0 also sleeps this long after each minibatch: a straggler whose
  // lag does not depend on how fast the machine computes (0: none).
  int straggler_delay_ms = 0;
  double eval_interval_s = 0;     // 0: evaluate only at the end
  // Early stopping (needs data.validation_fraction > 0): the validation set
  // is evaluated at the end of every epoch (as one worker sees it) and
  // training stops once its log loss has not improved for this many
  // evaluations in a row; the report says at which epoch, and the model of
  // the best evaluation is also saved in <output.model_dir>/best. 0 (the
  // default): off, every epoch is trained.
  int early_stopping = 0;
  // The servers' dense-id layout for the logistic regression weights
  // (issue 10): features with ids below this bound find their storage
  // through an array indexed by the id instead of a hash map, so a push or
  // pull does no hash lookup for them (the trained model is the same
  // either way). Costs 8 bytes of address space per id per server, touched
  // only where ids are used. 0: hash maps only. `auto`
  // (kAutoDenseFeatures, the default): data.synthetic.features for
  // synthetic data, 2^20 for libsvm (ids past it use the map), 0 for criteo
  // (its 39 columns hash into one key space). Unused by the mlp model.
  // At most kMaxDenseFeatures.
  int64_t dense_features = -1;  // kAutoDenseFeatures

  bool operator==(const TrainingConfig&) const = default;
};

// The dense CTR model (training.model: mlp; models/wide_deep.h): per-field
// embeddings of embedding_dim floats, concatenated, then fully connected
// ReLU layers of the `hidden` widths and a logistic output. Its tables are
// trained with their own update rule (`optimizer`, `learning_rate`, `l2`),
// not the `optimizer` section's (FTRL suits sparse LR, not a deep model).
struct MlpConfig {
  int embedding_dim = 8;
  std::vector<int> hidden = {256, 128};  // each >= 1; may be empty
  std::string optimizer = "adam";        // adam | adagrad | sgd
  double learning_rate = 0.001;
  double l2 = 0;
  // New embedding values ~ U(-s, s); layer weights use Glorot-uniform
  // scales derived from the layer sizes.
  double embedding_init = 0.05;
  // Inverted dropout after every hidden ReLU while training, [0, 1).
  double dropout = 0;
  // Wide & deep: also learn a linear model over the same 39 keys (one
  // weight per key, updated by the `optimizer` section's rule, FTRL by
  // default, as logistic regression's) whose output is added to the MLP's
  // logit; both parts are trained jointly on the same loss.
  bool wide = false;

  bool operator==(const MlpConfig&) const = default;
};

struct OutputConfig {
  std::string model_dir = "runs/model";
  std::string log_level = "info";

  bool operator==(const OutputConfig&) const = default;
};

// Issue 9: replication, failover, dynamic work, checkpoints. Each part of
// that work adds its fields here (and to Fields() in config.cc).
// The linger (fault_tolerance.replication_linger_ms): 20 ms since
// 2026-11-29. The replicated scale.yaml job (SSP) used 9 % less CPU than at
// 5 ms, in 3 of 3 interleaved pairs, and no more wall time in SSP, ASP or
// BSP: a delta covering four pushes instead of one or two carries 16 %
// fewer rows (keys pushed again within it go once) and a third of the
// per-range entries and batches (docs/fault_tolerance.md, "Stop 47").
inline constexpr double kDefaultReplicationLingerMs = 20;

struct FaultToleranceConfig {
  // Checkpoints (server/checkpoint.h). Seconds between checkpoints the
  // scheduler triggers while the job runs; 0 = none (on demand only:
  // ps_status --checkpoint).
  double checkpoint_interval_s = 0;
  // Where checkpoints go, one folder ckpt-<id> each; empty = a
  // `checkpoints` folder beside output.model_dir (CheckpointDirOf()).
  std::string checkpoint_dir;
  // Start from the newest complete checkpoint in checkpoint_dir (none there:
  // start fresh, with a warning).
  bool resume = false;
  // Start from this checkpoint folder (a ckpt-<id> with its MANIFEST);
  // excludes `resume`.
  std::string restore_from;
  // Complete checkpoints kept; older ones are deleted once a newer one is
  // complete.
  int checkpoints_kept = 2;

  // Dynamic work (scheduler/work_units.h): each epoch's training data is cut
  // into units of about this many rows (a byte range of a file, cut on line
  // boundaries, sized from the file's average line length; a row range of
  // the synthetic generator) that workers ask for when ready. `auto`
  // (kAutoWorkUnitRows, the default; ResolveAutoWorkUnitRows): about
  // kAutoMinibatchesPerUnit minibatches, fewer where that would leave a
  // worker fewer than kAutoUnitsPerWorker units an epoch, never less than
  // one minibatch. Each unit costs a GetWork round trip and a write of the
  // scheduler's state file; one-minibatch units made them a tenth of the
  // scale job's CPU (docs/benchmarks.md).
  int64_t work_unit_rows = 0;  // kAutoWorkUnitRows
  // Replication (docs/fault_tolerance.md): backups per key range, placed on
  // the next servers of the hash ring; a push is acknowledged once it is on
  // every live replica. -1 (default): 1 when there are at least 2 servers,
  // else 0. With 0 a dead server fails the job.
  int replicas = -1;
  // Failover: a server a worker or the scheduler could not reach is probed
  // (a status RPC, this long, twice); no answer confirms it dead at once,
  // without waiting for cluster.heartbeat_timeout_ms.
  int64_t probe_timeout_ms = 300;
  // Group commit of replication (ServerNode::SetReplicationLinger): a
  // primary's entries for a backup wait up to this long, so that pushes
  // arriving meanwhile share one round trip to the backup. What it may add
  // to a replicated push's acknowledgement; 0 sends each batch as soon as
  // the stream to the backup is idle.
  double replication_linger_ms = kDefaultReplicationLingerMs;
  // Every mode (ServerNode::SetReplicationDeltas; BSP since stop 63): a
  // primary sends a backup the result of a linger's inputs (each changed
  // row and the range's consistency state, in BSP with its buffered
  // clocks) instead of every push and clock for the backup to replay.
  // false: the per-input log in ASP/SSP, one entry per applied clock in
  // BSP (replication after aggregation).
  bool replicate_deltas = true;
  // Backups per range after the -1 default is resolved, capped at
  // num_servers - 1.
  int EffectiveReplicas(int num_servers) const {
    const int k = replicas < 0 ? (num_servers >= 2 ? 1 : 0) : replicas;
    return num_servers <= 1 ? 0 : (k < num_servers - 1 ? k : num_servers - 1);
  }
  bool operator==(const FaultToleranceConfig&) const = default;
};

// Issue 11: metrics and health (docs/observability.md).
struct ObservabilityConfig {
  // The port every node serves Prometheus metrics (/metrics) and /healthz
  // on, over HTTP on the host its gRPC binds to (0..65535; 0: none). One
  // port for all the nodes of a job: the one-node-per-host (or per-pod)
  // layout. Several nodes on one host need one port each: --metrics_port
  // or $PS_METRICS_PORT, which win over this field (ps_launch gives every
  // process a free one).
  int metrics_port = 0;

  bool operator==(const ObservabilityConfig&) const = default;
};

// Issue 10: what a worker's pushes leave out and how their values travel
// (the paper's sections 3.6 and 4.2; docs/filters.md). Every filter is off
// by default: the pushes are then exactly the gradients, as float32.
struct FilterConfig {
  // Significantly-modified filter: a key's row is sent only when some
  // element of (its gradient + what was held back for it) exceeds this in
  // absolute value; otherwise the sum is held back for the key's next push.
  // In the units of the values pushed (summed gradients). 0: off.
  double significant_threshold = 0;
  // KKT filter for L1-regularised logistic regression: a feature whose
  // pulled weight is 0 and whose gradient (per the optimizer's units,
  // see OptimizerConfig) is at most kkt_fraction * optimizer.l1 is not
  // pushed: by the optimality (KKT) condition of the L1 term it would stay
  // 0. In (0, 1]; 0: off. Needs optimizer.l1 > 0 and not adam.
  double kkt_fraction = 0;
  // How values travel: f32 | f16 (IEEE half) | int8 (one scale per key
  // range of a request).
  std::string value_encoding = "f32";
  // A general compressor for the encoded values: none | zstd | lz4. Used
  // only where it makes a request's values smaller (zero-heavy payloads).
  std::string codec = "none";
  // f16 / int8: add each value's rounding error to the key's next push, so
  // nothing is lost, only delayed; also what the significance filter holds
  // back. false: rounding errors are dropped.
  bool error_feedback = true;

  bool any() const {
    return significant_threshold > 0 || kkt_fraction > 0 ||
           value_encoding != "f32" || codec != "none";
  }
  bool operator==(const FilterConfig&) const = default;
};

// "none", or the filters that are on, e.g. "significant 0.01, f16, zstd"
// (the job report's push_filters).
std::string DescribeFilters(const FilterConfig& f);

struct JobConfig {
  ClusterConfig cluster;
  ConsistencyConfig consistency;
  OptimizerConfig optimizer;
  DataConfig data;
  TrainingConfig training;
  MlpConfig mlp;
  OutputConfig output;
  FaultToleranceConfig fault_tolerance;
  ObservabilityConfig observability;  // issue 11
  FilterConfig filters;               // issue 10

  // tau as the consistency controller sees it: 0 for BSP, -1 (infinity)
  // for ASP, the configured tau for SSP.
  int64_t EffectiveTau() const;

  bool operator==(const JobConfig&) const = default;
};

// Parses YAML text. Missing fields keep their defaults. Checks every field's
// type and range (string values must be valid UTF-8), and data.synthetic.nnz_per_row <= data.synthetic.features;
// not the constraints Validate() checks. A YAML syntax error is
// INVALID_ARGUMENT naming the line.
absl::StatusOr<JobConfig> ParseJobConfig(const std::string& yaml_text);
// Reads and parses a file; errors are prefixed with the path: NOT_FOUND when
// the file does not exist, INVALID_ARGUMENT when the path is a directory or
// not a regular file, PERMISSION_DENIED when it cannot be read.
// Relative paths the file sets (the fields ForEachPathField visits) are
// resolved against the file's own folder, made absolute; paths it leaves at
// their default stay as they are.
absl::StatusOr<JobConfig> LoadJobConfig(const std::string& path);
// LoadJobConfig(path) (defaults when `path` is empty), then each override in
// order, then Validate(). Relative paths given by overrides (and defaults)
// are resolved against the current directory, so every path field of the
// result is absolute (or empty). The one loader ps_launch and ps_scheduler
// share; errors name the file or the field.
absl::StatusOr<JobConfig> LoadJobConfigWithOverrides(
    const std::string& path, const std::vector<std::string>& overrides);

// `path` as seen from the folder `base_dir`: "" stays "", an absolute path
// is returned unchanged, a relative one becomes base_dir/path (lexically
// normalised; base_dir should itself be absolute).
std::string ResolvePath(const std::string& base_dir, const std::string& path);
// Calls fn(field_name, &value) for every field of `config` that names a file
// or a folder (data.train, data.test, output.model_dir, ...). New path
// fields are added to this one list, so they resolve like the others.
// fault_tolerance.checkpoint_dir, or its default: `checkpoints` beside
// output.model_dir.
std::string CheckpointDirOf(const JobConfig& config);

void ForEachPathField(
    JobConfig* config,
    const std::function<void(const char* field, std::string* path)>& fn);
// Applies one "section.field=value" override (value parsed as a YAML
// scalar), checked like the file except for cross-field checks, which depend
// on the order of overrides (run Validate() after the last one). On error
// `config` is unchanged.
absl::Status ApplyOverride(JobConfig* config, const std::string& assignment);
// Serialises every field to YAML that ParseJobConfig accepts:
// ParseJobConfig(ToYaml(c)) == c for every c that passes ParseJobConfig.
std::string ToYaml(const JobConfig& config);
// Checks cross-field constraints (data.train set for libsvm and criteo,
// data.synthetic.nnz_per_row <= features, cluster.heartbeat_timeout_ms >=
// 3 * cluster.heartbeat_ms, cluster.register_timeout_ms >= 2 *
// cluster.heartbeat_ms, output.model_dir not empty, training.model mlp only
// with data.format criteo, training.eval_interval_s > 0 only with a test
// set). Errors are INVALID_ARGUMENT naming the fields.
absl::Status Validate(const JobConfig& config);

// The updates per worker per epoch `training.minibatch: auto` aims at,
// and the fewest rows it gives an update: on criteo-10k (8000 rows, 4
// workers) 200 updates would mean 10-row updates, which SSP/ASP apply one
// by one and reach AUC 0.730 (LIBLINEAR 0.745); 24 rows reach 0.742-0.745
// in every mode (docs/lr_benchmark.md).
inline constexpr int64_t kAutoUpdatesPerEpoch = 200;
inline constexpr int kAutoMinibatchMin = 24;
inline constexpr int kAutoMinibatchMax = 1000;

// Replaces training.minibatch `auto` with rows / (workers *
// kAutoUpdatesPerEpoch) clamped to [kAutoMinibatchMin, kAutoMinibatchMax]
// ([24, 1000]), `estimated_rows` being the
// training rows of one epoch (< 0: unknown, then 100). Returns a line for
// the log saying what was chosen and why ("" when the minibatch was set).
std::string ResolveAutoMinibatch(JobConfig* config, int64_t estimated_rows);
// fault_tolerance.work_unit_rows `auto`: rows per unit of
// kAutoMinibatchesPerUnit minibatches, capped so that each worker gets at
// least kAutoUnitsPerWorker units an epoch (a slow or dead worker's share
// is then spread over the others in small parts), and at least one
// minibatch.
inline constexpr int64_t kAutoWorkUnitRows = 0;
inline constexpr int64_t kAutoDenseFeatures = -1;
inline constexpr int64_t kMaxDenseFeatures = int64_t{1} << 32;
// training.dense_features with `auto` resolved for the job's data.
int64_t DenseFeatures(const JobConfig& config);
inline constexpr int64_t kAutoMinibatchesPerUnit = 10;
inline constexpr int64_t kAutoUnitsPerWorker = 16;
// The rows per work unit `auto` stands for, `estimated_rows` being the
// training rows of one epoch (< 0: unknown, then no cap). Uses
// training.minibatch, 100 while it is still `auto`.
int64_t AutoWorkUnitRows(const JobConfig& config, int64_t estimated_rows);
// Replaces fault_tolerance.work_unit_rows `auto` with AutoWorkUnitRows;
// returns a line for the log ("" when it was set). Call after
// ResolveAutoMinibatch.
std::string ResolveAutoWorkUnitRows(JobConfig* config, int64_t estimated_rows);
// FAILED_PRECONDITION when training.minibatch is still `auto` (a trainer
// given a config the scheduler did not resolve).
absl::Status CheckMinibatchResolved(const TrainingConfig& training);
// Replaces training.epochs `auto` (see TrainingConfig::epochs); returns a
// log line ("" when epochs was set).
std::string ResolveAutoEpochs(JobConfig* config, int64_t estimated_rows);
// Applies optimizer.feature_scale to ftrl's parameters (see
// OptimizerConfig::feature_scale) with `estimated_scale` standing for
// `auto` (<= 0: unknown, then 1), and sets feature_scale to 1; returns a log
// line ("" when nothing changed).
std::string ResolveFeatureScale(JobConfig* config, double estimated_scale);

// What CheckJobResources demands of the machine.
struct ResourceCheckOptions {
  // Free space output.model_dir's file system must have.
  int64_t min_free_bytes = int64_t{64} << 20;
};

// Checks, before any process of a job starts, that the job can run on this
// machine (the config passed Validate, paths are absolute or relative to the
// current directory):
//   * data.train and data.test (when set, file formats only) exist, are
//     regular files, not empty and readable: NOT_FOUND (missing),
//     INVALID_ARGUMENT (a directory or other non-regular file),
//     FAILED_PRECONDITION (0 bytes), PERMISSION_DENIED (unreadable);
//   * output.model_dir exists or can be created, and a probe file can be
//     written and removed in it: PERMISSION_DENIED or FAILED_PRECONDITION
//     (read-only file system, a file in the way, ...);
//   * its file system has at least options.min_free_bytes free:
//     RESOURCE_EXHAUSTED.
// Each message names the config field and the path, e.g. "config field
// data.train: /data/a9a: no such file". Creates model_dir as a side effect.
absl::Status CheckJobResources(const JobConfig& config,
                               const ResourceCheckOptions& options = {});

// "bsp", "ssp" or "asp".
const char* ModeName(Mode mode);

// The update rule a table of the servers runs (proto/ps.proto).
proto::OptimizerConfig OptimizerProto(const OptimizerConfig& o);
// The inverse (init_scale, a table's and not the rule's, is left out).
OptimizerConfig OptimizerFromProto(const proto::OptimizerConfig& p);

}  // namespace ps
