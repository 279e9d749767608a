#include "common/config.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "yaml-cpp/yaml.h"

namespace ps {
namespace {

// The controller's "infinite tau" (consistency/controller.h kInfiniteTau);
// ps_common cannot depend on ps_consistency.
constexpr int64_t kInfTau = -1;

absl::Status FieldError(absl::string_view path, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("config field ", path, ": ", what));
}

// How a node reads in an error message: 'text', null, a mapping, ...
std::string Describe(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Scalar:
      return absl::StrCat("'", n.Scalar(), "'");
    case YAML::NodeType::Sequence:
      return "a sequence";
    case YAML::NodeType::Map:
      return "a mapping";
    case YAML::NodeType::Null:
      return "null";
    default:
      return "nothing";
  }
}

// Shortest text that parses back to exactly `v`.
std::string FormatDouble(double v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  if (ec != std::errc()) return absl::StrCat(v);
  return std::string(buf, end);
}

// One field: its dotted path, a setter that checks type and range and
// assigns only on success, and a getter giving its YAML scalar text.
struct Field {
  std::string path;
  std::function<absl::Status(const YAML::Node&, JobConfig*)> set;
  std::function<std::string(const JobConfig&)> get;
  bool quote = false;  // emit as a double-quoted string
};

template <typename T>
using Member = T& (*)(JobConfig&);

// The getters read through the same accessor as the setters; they never
// write, so the const_cast is safe.
template <typename T>
const T& Read(Member<T> m, const JobConfig& c) {
  return m(const_cast<JobConfig&>(c));
}

template <typename T>
Field IntField(std::string path, Member<T> m, int64_t lo,
               int64_t hi = std::numeric_limits<T>::max()) {
  Field f;
  f.path = path;
  f.set = [path, m, lo, hi](const YAML::Node& n, JobConfig* c) {
    int64_t v = 0;
    if (!n.IsScalar() ||
        !absl::SimpleAtoi(absl::StripAsciiWhitespace(n.Scalar()), &v)) {
      return FieldError(path,
                        absl::StrCat("expected an integer, got ", Describe(n)));
    }
    if (v < lo) {
      return FieldError(path, absl::StrCat("must be >= ", lo, ", got ", v));
    }
    if (v > hi) {
      return FieldError(path, absl::StrCat("must be <= ", hi, ", got ", v));
    }
    m(*c) = static_cast<T>(v);
    return absl::OkStatus();
  };
  f.get = [m](const JobConfig& c) { return absl::StrCat(Read(m, c)); };
  return f;
}

Field Uint64Field(std::string path, Member<uint64_t> m) {
  Field f;
  f.path = path;
  f.set = [path, m](const YAML::Node& n, JobConfig* c) {
    uint64_t v = 0;
    if (!n.IsScalar() ||
        !absl::SimpleAtoi(absl::StripAsciiWhitespace(n.Scalar()), &v)) {
      return FieldError(path, absl::StrCat("expected a non-negative integer, got ",
                                           Describe(n)));
    }
    m(*c) = v;
    return absl::OkStatus();
  };
  f.get = [m](const JobConfig& c) { return absl::StrCat(Read(m, c)); };
  return f;
}

// Bounds of a double field; an open bound excludes its value.
struct DoubleRange {
  double lo;
  bool lo_open;
  bool has_hi = false;
  double hi = 0;
  bool hi_open = false;

  bool Contains(double v) const {
    if (lo_open ? v <= lo : v < lo) return false;
    if (has_hi && (hi_open ? v >= hi : v > hi)) return false;
    return true;
  }
  std::string Describe() const {
    if (!has_hi) return absl::StrCat(lo_open ? "> " : ">= ", FormatDouble(lo));
    return absl::StrCat("in ", lo_open ? "(" : "[", FormatDouble(lo), ", ",
                        FormatDouble(hi), hi_open ? ")" : "]");
  }
};

Field DoubleField(std::string path, Member<double> m, DoubleRange range) {
  Field f;
  f.path = path;
  f.set = [path, m, range](const YAML::Node& n, JobConfig* c) {
    double v = 0;
    if (!n.IsScalar() ||
        !absl::SimpleAtod(absl::StripAsciiWhitespace(n.Scalar()), &v) ||
        !std::isfinite(v)) {
      return FieldError(path,
                        absl::StrCat("expected a number, got ", Describe(n)));
    }
    if (!range.Contains(v)) {
      return FieldError(path, absl::StrCat("must be ", range.Describe(),
                                           ", got ", FormatDouble(v)));
    }
    m(*c) = v;
    return absl::OkStatus();
  };
  f.get = [m](const JobConfig& c) { return FormatDouble(Read(m, c)); };
  return f;
}

// True when `s` is well-formed UTF-8 (no overlong forms, no surrogates, at
// most U+10FFFF). YAML text is Unicode: yaml-cpp's emitter replaces invalid
// bytes with U+FFFD, so ToYaml would silently change such a string (found
// by fuzz_config; see fuzz/regressions/config/).
bool IsValidUtf8(absl::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = s[i];
    int n;
    uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      n = 1;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      n = 2;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      n = 3;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + n >= s.size()) return false;  // truncated sequence
    for (int k = 1; k <= n; ++k) {
      const unsigned char d = s[i + k];
      if ((d & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    static constexpr uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
      return false;
    }
    i += n + 1;
  }
  return true;
}

// `allowed` empty: any string. Null (`key:` with no value) reads as "".
// Not UTF-8: INVALID_ARGUMENT.
Field StringField(std::string path, Member<std::string> m,
                  std::vector<std::string> allowed = {}) {
  Field f;
  f.path = path;
  f.quote = true;
  f.set = [path, m, allowed](const YAML::Node& n, JobConfig* c) {
    if (!n.IsScalar() && !n.IsNull()) {
      return FieldError(path,
                        absl::StrCat("expected a string, got ", Describe(n)));
    }
    std::string v = n.IsNull() ? "" : n.Scalar();
    if (!IsValidUtf8(v)) return FieldError(path, "is not valid UTF-8");
    if (!allowed.empty() &&
        std::find(allowed.begin(), allowed.end(), v) == allowed.end()) {
      return FieldError(path, absl::StrCat("must be one of ",
                                           absl::StrJoin(allowed, "|"),
                                           ", got '", v, "'"));
    }
    m(*c) = std::move(v);
    return absl::OkStatus();
  };
  f.get = [m](const JobConfig& c) { return Read(m, c); };
  return f;
}

Field BoolField(std::string path, Member<bool> m) {
  Field f;
  f.path = path;
  f.set = [path, m](const YAML::Node& n, JobConfig* c) {
    const std::string v =
        n.IsScalar() ? absl::AsciiStrToLower(n.Scalar()) : std::string();
    if (v == "true" || v == "yes" || v == "on") {
      m(*c) = true;
    } else if (v == "false" || v == "no" || v == "off") {
      m(*c) = false;
    } else {
      return FieldError(path, absl::StrCat("expected true or false, got ",
                                           Describe(n)));
    }
    return absl::OkStatus();
  };
  f.get = [m](const JobConfig& c) {
    return std::string(Read(m, c) ? "true" : "false");
  };
  return f;
}

// A list of integers, each in [lo, hi]: a YAML sequence ([256, 128]), or a
// scalar of comma-separated integers ("256,128", as --set gives it; "" or
// "[]" is the empty list). Written back as "256,128".
Field IntListField(std::string path, Member<std::vector<int>> m, int lo, int hi) {
  Field f;
  f.path = path;
  f.quote = true;
  f.set = [path, m, lo, hi](const YAML::Node& n, JobConfig* c) {
    std::vector<std::string> items;
    if (n.IsSequence()) {
      for (const auto& e : n) {
        if (!e.IsScalar()) {
          return FieldError(path, absl::StrCat("expected integers, got ",
                                               Describe(e)));
        }
        items.push_back(e.Scalar());
      }
    } else if (n.IsScalar() || n.IsNull()) {
      std::string text = n.IsNull() ? "" : n.Scalar();
      absl::string_view t = absl::StripAsciiWhitespace(text);
      if (absl::ConsumePrefix(&t, "[") && !absl::ConsumeSuffix(&t, "]")) {
        return FieldError(path, absl::StrCat("unbalanced '[' in '", text, "'"));
      }
      t = absl::StripAsciiWhitespace(t);
      if (!t.empty()) {
        for (absl::string_view part : absl::StrSplit(t, ',')) {
          items.emplace_back(absl::StripAsciiWhitespace(part));
        }
      }
    } else {
      return FieldError(path, absl::StrCat("expected a list of integers, got ",
                                           Describe(n)));
    }
    std::vector<int> out;
    for (const std::string& item : items) {
      int v = 0;
      if (!absl::SimpleAtoi(item, &v)) {
        return FieldError(path, absl::StrCat("expected an integer, got '",
                                             item, "'"));
      }
      if (v < lo || v > hi) {
        return FieldError(path, absl::StrCat("every entry must be in [", lo,
                                             ", ", hi, "], got ", v));
      }
      out.push_back(v);
    }
    m(*c) = std::move(out);
    return absl::OkStatus();
  };
  f.get = [m](const JobConfig& c) { return absl::StrJoin(Read(m, c), ","); };
  return f;
}

Field ModeField() {
  Field f;
  f.path = "consistency.mode";
  f.set = [path = f.path](const YAML::Node& n, JobConfig* c) {
    const std::string v =
        n.IsScalar() ? absl::AsciiStrToLower(n.Scalar()) : std::string();
    if (v == "bsp") {
      c->consistency.mode = Mode::kBsp;
    } else if (v == "ssp") {
      c->consistency.mode = Mode::kSsp;
    } else if (v == "asp") {
      c->consistency.mode = Mode::kAsp;
    } else {
      return FieldError(
          path, absl::StrCat("must be one of bsp|ssp|asp, got ", Describe(n)));
    }
    return absl::OkStatus();
  };
  f.get = [](const JobConfig& c) {
    return std::string(ModeName(c.consistency.mode));
  };
  return f;
}

// An integer >= 0, or `inf` (stored as kInfTau).
Field TauField() {
  Field f;
  f.path = "consistency.tau";
  f.set = [path = f.path](const YAML::Node& n, JobConfig* c) {
    const std::string v = n.IsScalar()
                              ? absl::AsciiStrToLower(
                                    absl::StripAsciiWhitespace(n.Scalar()))
                              : std::string();
    if (v == "inf" || v == ".inf" || v == "infinity") {
      c->consistency.tau = kInfTau;
      return absl::OkStatus();
    }
    int64_t tau = 0;
    if (!n.IsScalar() || !absl::SimpleAtoi(v, &tau)) {
      return FieldError(path, absl::StrCat("expected an integer or inf, got ",
                                           Describe(n)));
    }
    if (tau < 0) {
      return FieldError(path,
                        absl::StrCat("must be >= 0 or inf, got ", tau));
    }
    c->consistency.tau = tau;
    return absl::OkStatus();
  };
  f.get = [](const JobConfig& c) {
    return c.consistency.tau < 0 ? std::string("inf")
                                 : absl::StrCat(c.consistency.tau);
  };
  return f;
}

// A positive integer (at most T's maximum), or `auto` (stored as
// `auto_value`): training.minibatch, training.epochs,
// fault_tolerance.work_unit_rows.
template <typename T>
Field AutoIntField(std::string path, Member<T> m, T auto_value,
                   int64_t lo = 1,
                   int64_t hi = std::numeric_limits<T>::max()) {
  Field f;
  f.path = path;
  f.set = [path, m, auto_value, lo, hi](const YAML::Node& n, JobConfig* c) {
    const std::string v = n.IsScalar()
                              ? absl::AsciiStrToLower(
                                    absl::StripAsciiWhitespace(n.Scalar()))
                              : std::string();
    if (v == "auto") {
      m(*c) = auto_value;
      return absl::OkStatus();
    }
    int64_t x = 0;
    if (!n.IsScalar() || !absl::SimpleAtoi(v, &x)) {
      return FieldError(path, absl::StrCat("expected an integer, got ",
                                           Describe(n), " (or auto)"));
    }
    if (x < lo || x > hi) {
      return FieldError(
          path, hi == std::numeric_limits<T>::max()
                    ? absl::StrCat("must be >= ", lo, ", got ", x, " (or auto)")
                    : absl::StrCat("must be in [", lo, ", ", hi, "], got ", x,
                                   " (or auto)"));
    }
    m(*c) = static_cast<T>(x);
    return absl::OkStatus();
  };
  f.get = [m, auto_value](const JobConfig& c) {
    const T v = Read(m, c);
    return v == auto_value ? std::string("auto") : absl::StrCat(v);
  };
  return f;
}

// A finite number > 0, or `auto` (stored as `auto_value`).
Field AutoDoubleField(std::string path, Member<double> m, double auto_value) {
  Field f;
  f.path = path;
  f.set = [path, m, auto_value](const YAML::Node& n, JobConfig* c) {
    const std::string v = n.IsScalar()
                              ? absl::AsciiStrToLower(
                                    absl::StripAsciiWhitespace(n.Scalar()))
                              : std::string();
    if (v == "auto") {
      m(*c) = auto_value;
      return absl::OkStatus();
    }
    double x = 0;
    if (!n.IsScalar() || !absl::SimpleAtod(v, &x)) {
      return FieldError(path, absl::StrCat("expected a number, got ",
                                           Describe(n), " (or auto)"));
    }
    if (!std::isfinite(x) || x <= 0) {
      return FieldError(path, absl::StrCat("must be > 0 and finite, got ",
                                           FormatDouble(x), " (or auto)"));
    }
    m(*c) = x;
    return absl::OkStatus();
  };
  f.get = [m, auto_value](const JobConfig& c) {
    const double v = Read(m, c);
    return v == auto_value ? std::string("auto") : FormatDouble(v);
  };
  return f;
}

// "section.field" and an accessor for it, e.g. PS_CFG(training, minibatch).
#define PS_CFG(section, field)   \
  #section "." #field,           \
      +[](JobConfig& c) -> auto& { return c.section.field; }

constexpr DoubleRange kPositive{0, /*lo_open=*/true};
constexpr DoubleRange kNonNegative{0, /*lo_open=*/false};

// Every field, in the order ToYaml writes them (grouped by section).
const std::vector<Field>& Fields() {
  static const std::vector<Field>* fields = new std::vector<Field>{
      StringField(PS_CFG(cluster, scheduler)),
      IntField<int>(PS_CFG(cluster, num_servers), 1, 1024),
      IntField<int>(PS_CFG(cluster, num_workers), 1, 1024),
      IntField<int>(PS_CFG(cluster, virtual_nodes), 1, 4096),
      IntField<int>(PS_CFG(cluster, heartbeat_ms), 10),
      IntField<int>(PS_CFG(cluster, heartbeat_timeout_ms), 100),
      IntField<int>(PS_CFG(cluster, scheduler_timeout_ms), 100),
      IntField<int>(PS_CFG(cluster, register_timeout_ms), 100),
      StringField(PS_CFG(cluster, auth_token)),
      StringField(PS_CFG(cluster, bind_host)),
      // Limits, TLS (issue 8: security).
      IntField<int>(PS_CFG(cluster, max_message_mb), 1, 2047),
      BoolField(PS_CFG(cluster, key_caching)),
      BoolField(PS_CFG(cluster, data_plane)),
      BoolField(PS_CFG(cluster, local_socket)),
      IntField<int>(PS_CFG(cluster, shared_memory_mb), 0, 4096),
      StringField(PS_CFG(cluster.tls, cert_file)),
      StringField(PS_CFG(cluster.tls, key_file)),
      StringField(PS_CFG(cluster.tls, ca_file)),
      BoolField(PS_CFG(cluster.tls, require_client_cert)),
      ModeField(),
      TauField(),
      IntField<int64_t>(PS_CFG(consistency, pull_timeout_ms), 1),
      StringField(PS_CFG(optimizer, name), {"sgd", "adagrad", "ftrl", "adam"}),
      DoubleField(PS_CFG(optimizer, learning_rate), kPositive),
      DoubleField(PS_CFG(optimizer, alpha), kPositive),
      DoubleField(PS_CFG(optimizer, beta), kNonNegative),
      DoubleField(PS_CFG(optimizer, l1), kNonNegative),
      DoubleField(PS_CFG(optimizer, l2), kNonNegative),
      DoubleField(PS_CFG(optimizer, initial_accumulator), kNonNegative),
      AutoDoubleField(PS_CFG(optimizer, feature_scale), kAutoFeatureScale),
      StringField(PS_CFG(data, format), {"synthetic", "libsvm", "criteo"}),
      StringField(PS_CFG(data, train)),
      StringField(PS_CFG(data, test)),
      BoolField(PS_CFG(data, skip_malformed)),
      BoolField(PS_CFG(data, shuffle)),
      IntField<int64_t>(PS_CFG(data, shuffle_buffer_rows), 1),
      DoubleField(PS_CFG(data, validation_fraction),
                  {0, /*lo_open=*/false, /*has_hi=*/true, 0.5}),
      IntField<int64_t>(PS_CFG(data.synthetic, train_rows), 1),
      IntField<int64_t>(PS_CFG(data.synthetic, test_rows), 0),
      IntField<int64_t>(PS_CFG(data.synthetic, features), 1),
      // <= features is checked once the whole document is read.
      IntField<int>(PS_CFG(data.synthetic, nnz_per_row), 1),
      DoubleField(PS_CFG(data.synthetic, zipf_exponent), kNonNegative),
      DoubleField(PS_CFG(data.synthetic, true_sparsity),
                  {0, /*lo_open=*/true, /*has_hi=*/true, 1, /*hi_open=*/false}),
      DoubleField(PS_CFG(data.synthetic, label_noise),
                  {0, /*lo_open=*/false, /*has_hi=*/true, 0.5,
                   /*hi_open=*/false}),
      Uint64Field(PS_CFG(data.synthetic, seed)),
      StringField(PS_CFG(training, model), {"logistic_regression", "mlp"}),
      AutoIntField<int>(PS_CFG(training, minibatch), kAutoMinibatch),
      AutoIntField<int>(PS_CFG(training, epochs), kAutoEpochs),
      IntField<int>(PS_CFG(training, threads), 1, 256),
      StringField(PS_CFG(training, backend), {"cpu", "cuda", "auto"}),
      DoubleField(PS_CFG(training, progress_interval_s), kPositive),
      Uint64Field(PS_CFG(training, seed)),
      DoubleField(PS_CFG(training, straggler_factor), {1, /*lo_open=*/false}),
      IntField<int>(PS_CFG(training, straggler_delay_ms), 0, 600000),
      DoubleField(PS_CFG(training, eval_interval_s), kNonNegative),
      IntField<int>(PS_CFG(training, early_stopping), 0, 1000),
      AutoIntField<int64_t>(PS_CFG(training, dense_features),
                            kAutoDenseFeatures, 0, kMaxDenseFeatures),
      IntField<int>(PS_CFG(mlp, embedding_dim), 1, 1024),
      IntListField(PS_CFG(mlp, hidden), 1, 65536),
      StringField(PS_CFG(mlp, optimizer), {"adam", "adagrad", "sgd"}),
      DoubleField(PS_CFG(mlp, learning_rate), kPositive),
      DoubleField(PS_CFG(mlp, l2), kNonNegative),
      DoubleField(PS_CFG(mlp, embedding_init), kNonNegative),
      DoubleField(PS_CFG(mlp, dropout),
                  {0, /*lo_open=*/false, /*has_hi=*/true, 1, /*hi_open=*/true}),
      BoolField(PS_CFG(mlp, wide)),
      StringField(PS_CFG(output, model_dir)),
      StringField(PS_CFG(output, log_level), {"debug", "info", "warn", "error"}),
      // Checkpoints (issue 9).
      DoubleField(PS_CFG(fault_tolerance, checkpoint_interval_s), kNonNegative),
      StringField(PS_CFG(fault_tolerance, checkpoint_dir)),
      BoolField(PS_CFG(fault_tolerance, resume)),
      StringField(PS_CFG(fault_tolerance, restore_from)),
      IntField<int>(PS_CFG(fault_tolerance, checkpoints_kept), 1, 1000),
      AutoIntField<int64_t>(PS_CFG(fault_tolerance, work_unit_rows),
                            kAutoWorkUnitRows),
      IntField<int>(PS_CFG(fault_tolerance, replicas), -1, 8),
      IntField<int64_t>(PS_CFG(fault_tolerance, probe_timeout_ms), 1),
      DoubleField(PS_CFG(fault_tolerance, replication_linger_ms),
                  {0, /*lo_open=*/false, /*has_hi=*/true, 1000,
                   /*hi_open=*/false}),
      BoolField(PS_CFG(fault_tolerance, replicate_deltas)),
      // Metrics and health (issue 11).
      IntField<int>(PS_CFG(observability, metrics_port), 0, 65535),
      // Filters and compression (issue 10).
      DoubleField(PS_CFG(filters, significant_threshold), kNonNegative),
      DoubleField(PS_CFG(filters, kkt_fraction),
                  {0, /*lo_open=*/false, /*has_hi=*/true, 1,
                   /*hi_open=*/false}),
      StringField(PS_CFG(filters, value_encoding), {"f32", "f16", "int8"}),
      StringField(PS_CFG(filters, codec), {"none", "zstd", "lz4"}),
      BoolField(PS_CFG(filters, error_feedback)),
  };
  return *fields;
}

#undef PS_CFG

bool IsSection(absl::string_view path) {
  return path == "cluster" || path == "consistency" || path == "optimizer" ||
         path == "data" || path == "data.synthetic" || path == "training" ||
         path == "mlp" || path == "output" || path == "fault_tolerance" ||
         path == "cluster.tls" ||  // limits, TLS (issue 8: security)
         path == "observability" ||  // issue 11
         path == "filters";          // issue 10
}

const Field* FindField(absl::string_view path) {
  for (const Field& f : Fields()) {
    if (f.path == path) return &f;
  }
  return nullptr;
}

// Constraints between fields that Parse can check once it has read them all.
absl::Status CheckCrossField(const JobConfig& c) {
  const SyntheticConfig& s = c.data.synthetic;
  if (s.nnz_per_row > s.features) {
    return FieldError("data.synthetic.nnz_per_row",
                      absl::StrCat("must be <= data.synthetic.features (",
                                   s.features, "), got ", s.nnz_per_row));
  }
  // The KKT filter is the L1 term's optimality condition: without an L1
  // term (or with adam, which has none) it would drop real gradients.
  if (c.filters.kkt_fraction > 0) {
    if (c.training.model != "logistic_regression") {
      return FieldError("filters.kkt_fraction",
                        absl::StrCat("is for logistic_regression, got "
                                     "training.model ",
                                     c.training.model));
    }
    if (c.optimizer.name == "adam" || c.optimizer.l1 <= 0) {
      return FieldError(
          "filters.kkt_fraction",
          absl::StrCat("needs an L1 term (optimizer.l1 > 0, not adam), got ",
                       c.optimizer.name, " with l1 ",
                       FormatDouble(c.optimizer.l1)));
    }
  }
  return absl::OkStatus();
}

absl::Status ParseMap(const YAML::Node& node, const std::string& prefix,
                      JobConfig* c, std::set<std::string>* seen) {
  for (const auto& kv : node) {
    if (!kv.first.IsScalar()) {
      return FieldError(prefix.empty() ? "<top level>" : prefix,
                        absl::StrCat("keys must be plain names, got ",
                                     Describe(kv.first)));
    }
    const std::string& key = kv.first.Scalar();
    const std::string path = prefix.empty() ? key : absl::StrCat(prefix, ".", key);
    const Field* field = nullptr;
    const bool plain_name =
        !key.empty() && key.find('.') == std::string::npos;
    if (plain_name && IsSection(path)) {
      if (!seen->insert(path).second) return FieldError(path, "duplicate key");
      if (kv.second.IsNull()) continue;  // empty section: all defaults
      if (!kv.second.IsMap()) {
        return FieldError(path, absl::StrCat("expected a mapping, got ",
                                             Describe(kv.second)));
      }
      PS_RETURN_IF_ERROR(ParseMap(kv.second, path, c, seen));
      continue;
    }
    if (plain_name) field = FindField(path);
    if (field == nullptr) return FieldError(path, "unknown key");
    if (!seen->insert(path).second) return FieldError(path, "duplicate key");
    PS_RETURN_IF_ERROR(field->set(kv.second, c));
  }
  return absl::OkStatus();
}

absl::Status SyntaxError(const YAML::Exception& e) {
  return absl::InvalidArgumentError(absl::StrCat(
      "YAML syntax error at line ", e.mark.line + 1, ", column ",
      e.mark.column + 1, ": ", e.msg));
}

}  // namespace

std::string ResolveAutoMinibatch(JobConfig* config, int64_t estimated_rows) {
  TrainingConfig& t = config->training;
  if (t.minibatch != kAutoMinibatch) return "";
  const int64_t workers = std::max(1, config->cluster.num_workers);
  if (estimated_rows < 0) {
    t.minibatch = 100;
    return "training.minibatch auto: 100 (the scheduler cannot see the "
           "training data to size it)";
  }
  const int64_t per_worker = estimated_rows / workers;
  t.minibatch = static_cast<int>(std::clamp<int64_t>(
      per_worker / kAutoUpdatesPerEpoch, kAutoMinibatchMin,
      kAutoMinibatchMax));
  return absl::StrCat("training.minibatch auto: ", t.minibatch, " (about ",
                      estimated_rows, " training rows, ", workers,
                      " workers: about ", per_worker / t.minibatch,
                      " updates per worker per epoch)");
}

int64_t AutoWorkUnitRows(const JobConfig& config, int64_t estimated_rows) {
  const int64_t minibatch = config.training.minibatch == kAutoMinibatch
                                ? 100
                                : config.training.minibatch;
  int64_t rows = kAutoMinibatchesPerUnit * minibatch;
  if (estimated_rows >= 0) {
    const int64_t workers = std::max(1, config.cluster.num_workers);
    rows = std::min(rows, estimated_rows / (workers * kAutoUnitsPerWorker));
  }
  return std::max(minibatch, rows);
}

std::string ResolveAutoWorkUnitRows(JobConfig* config,
                                    int64_t estimated_rows) {
  int64_t& rows = config->fault_tolerance.work_unit_rows;
  if (rows != kAutoWorkUnitRows) return "";
  rows = AutoWorkUnitRows(*config, estimated_rows);
  return absl::StrCat("fault_tolerance.work_unit_rows auto: ", rows, " (",
                      rows / std::max(1, config->training.minibatch),
                      " minibatches of ", config->training.minibatch,
                      " rows; about ",
                      estimated_rows < 0
                          ? std::string("? (the data's size is unknown)")
                          : absl::StrCat(std::max<int64_t>(
                                1, estimated_rows / rows)),
                      " units an epoch)");
}

absl::Status CheckMinibatchResolved(const TrainingConfig& training) {
  if (training.minibatch >= 1 && training.epochs >= 1) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(
      "training.minibatch or training.epochs is auto: the scheduler sizes "
      "them from the data (ResolveAutoMinibatch, ResolveAutoEpochs) before "
      "a trainer may use them");
}

std::string ResolveAutoEpochs(JobConfig* config, int64_t estimated_rows) {
  TrainingConfig& t = config->training;
  if (t.epochs != kAutoEpochs) return "";
  if (estimated_rows < 0) {
    t.epochs = 1;
    return "training.epochs auto: 1 (the scheduler cannot see the training "
           "data)";
  }
  const int64_t rows = std::max<int64_t>(1, estimated_rows);
  t.epochs = static_cast<int>(
      std::clamp<int64_t>((100000 + rows - 1) / rows, 1, 3));
  return absl::StrCat("training.epochs auto: ", t.epochs, " (about ",
                      estimated_rows, " training rows)");
}

std::string ResolveFeatureScale(JobConfig* config, double estimated_scale) {
  OptimizerConfig& o = config->optimizer;
  double s = o.feature_scale;
  const bool automatic = s == kAutoFeatureScale;
  if (automatic) s = estimated_scale > 0 ? estimated_scale : 1.0;
  o.feature_scale = 1.0;
  if (o.name != "ftrl" || s == 1.0) return "";
  o.alpha /= s;
  o.beta *= s;
  o.l1 *= s;
  o.l2 *= s * s;
  return absl::StrCat("optimizer.feature_scale ", automatic ? "auto: " : "",
                      FormatDouble(s),
                      automatic ? " (the mean |feature value| of the training "
                                  "file's first lines)"
                                : "",
                      ": ftrl alpha ", FormatDouble(o.alpha), ", beta ",
                      FormatDouble(o.beta), ", l1 ", FormatDouble(o.l1),
                      ", l2 ", FormatDouble(o.l2));
}

int64_t DenseFeatures(const JobConfig& config) {
  const int64_t v = config.training.dense_features;
  if (v != kAutoDenseFeatures) return v;
  if (config.data.format == "synthetic") return config.data.synthetic.features;
  if (config.data.format == "libsvm") return int64_t{1} << 20;
  return 0;
}

int64_t JobConfig::EffectiveTau() const {
  switch (consistency.mode) {
    case Mode::kBsp:
      return 0;
    case Mode::kAsp:
      return kInfTau;
    case Mode::kSsp:
      return consistency.tau < 0 ? kInfTau : consistency.tau;
  }
  return consistency.tau;
}

const char* ModeName(Mode mode) {
  switch (mode) {
    case Mode::kBsp:
      return "bsp";
    case Mode::kSsp:
      return "ssp";
    case Mode::kAsp:
      return "asp";
  }
  return "unknown";
}

namespace {

// ParseJobConfig, also telling which fields the text set (in *seen).
absl::StatusOr<JobConfig> ParseWithFields(const std::string& yaml_text,
                                          std::set<std::string>* seen) {
  JobConfig config;
  try {
    YAML::Node root = YAML::Load(yaml_text);
    if (root.IsNull()) return config;  // empty document: all defaults
    if (!root.IsMap()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config: expected a mapping of sections at the top level, got ",
          Describe(root)));
    }
    PS_RETURN_IF_ERROR(ParseMap(root, "", &config, seen));
  } catch (const YAML::Exception& e) {
    return SyntaxError(e);
  }
  PS_RETURN_IF_ERROR(CheckCrossField(config));
  return config;
}

}  // namespace

absl::StatusOr<JobConfig> ParseJobConfig(const std::string& yaml_text) {
  std::set<std::string> seen;
  return ParseWithFields(yaml_text, &seen);
}

absl::StatusOr<JobConfig> LoadJobConfig(const std::string& path) {
  // Regression (issue 8, "--config DIR runs the default job"): an ifstream
  // opens a directory and reads it as an empty document, i.e. defaults.
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    const std::string msg =
        absl::StrCat(path, ": cannot open config file: ", std::strerror(err));
    if (err == ENOENT || err == ENOTDIR) return absl::NotFoundError(msg);
    if (err == EACCES) return absl::PermissionDeniedError(msg);
    return absl::InvalidArgumentError(msg);
  }
  if (S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": is a directory, not a config file (name the .yaml file)"));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a regular file, cannot be a config file"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::PermissionDeniedError(absl::StrCat(
        path, ": cannot read config file: ", std::strerror(errno)));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) {
    return absl::DataLossError(absl::StrCat(path, ": read failed"));
  }
  std::set<std::string> seen;
  absl::StatusOr<JobConfig> config = ParseWithFields(text.str(), &seen);
  if (!config.ok()) {
    return absl::Status(config.status().code(),
                        absl::StrCat(path, ": ", config.status().message()));
  }
  // Paths the file names are relative to the file, wherever it is run from.
  std::error_code ec;
  const std::filesystem::path folder =
      std::filesystem::absolute(std::filesystem::path(path), ec).parent_path();
  ForEachPathField(&*config, [&](const char* field, std::string* value) {
    if (seen.count(field) > 0) *value = ResolvePath(folder.string(), *value);
  });
  return config;
}

absl::StatusOr<JobConfig> LoadJobConfigWithOverrides(
    const std::string& path, const std::vector<std::string>& overrides) {
  JobConfig config;
  if (!path.empty()) {
    PS_ASSIGN_OR_RETURN(config, LoadJobConfig(path));
  }
  for (const std::string& o : overrides) {
    PS_RETURN_IF_ERROR(ApplyOverride(&config, o));
  }
  PS_RETURN_IF_ERROR(Validate(config));
  // What is still relative came from the command line or a default: it is
  // relative to where the command runs. Made absolute so that the resolved
  // config (ps_launch's job.yaml, the view sent to nodes) means the same
  // from any folder.
  std::error_code ec;
  const std::string cwd = std::filesystem::current_path(ec).string();
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot read the current directory: ", ec.message()));
  }
  ForEachPathField(&config, [&](const char*, std::string* value) {
    *value = ResolvePath(cwd, *value);
  });
  return config;
}

std::string ResolvePath(const std::string& base_dir, const std::string& path) {
  if (path.empty()) return path;
  const std::filesystem::path p(path);
  if (p.is_absolute()) return path;
  return (std::filesystem::path(base_dir) / p).lexically_normal().string();
}

void ForEachPathField(
    JobConfig* config,
    const std::function<void(const char* field, std::string* path)>& fn) {
  fn("data.train", &config->data.train);
  fn("data.test", &config->data.test);
  fn("output.model_dir", &config->output.model_dir);
  // Checkpoints (issue 9).
  fn("fault_tolerance.checkpoint_dir", &config->fault_tolerance.checkpoint_dir);
  fn("fault_tolerance.restore_from", &config->fault_tolerance.restore_from);
}

std::string CheckpointDirOf(const JobConfig& config) {
  if (!config.fault_tolerance.checkpoint_dir.empty()) {
    return config.fault_tolerance.checkpoint_dir;
  }
  const std::filesystem::path model(config.output.model_dir);
  std::filesystem::path parent = model.lexically_normal().parent_path();
  if (model.filename().empty()) parent = parent.parent_path();  // "dir/"
  return (parent / "checkpoints").string();
}

absl::Status ApplyOverride(JobConfig* config, const std::string& assignment) {
  const size_t eq = assignment.find('=');
  if (eq == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "override '", assignment, "': expected section.field=value"));
  }
  const std::string path(
      absl::StripAsciiWhitespace(absl::string_view(assignment).substr(0, eq)));
  const std::string value = assignment.substr(eq + 1);
  if (IsSection(path)) {
    return FieldError(path, "is a section; override one of its fields");
  }
  const Field* field = FindField(path);
  if (field == nullptr) return FieldError(path, "unknown key");
  YAML::Node node;
  try {
    node = YAML::Load(value);
  } catch (const YAML::Exception& e) {
    return FieldError(path, absl::StrCat("cannot parse value '", value,
                                         "': ", e.msg));
  }
  JobConfig updated = *config;
  PS_RETURN_IF_ERROR(field->set(node, &updated));
  *config = std::move(updated);
  return absl::OkStatus();
}

std::string ToYaml(const JobConfig& config) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  std::vector<std::string> open;  // sections currently open, outermost first
  for (const Field& f : Fields()) {
    std::vector<std::string> parts = absl::StrSplit(f.path, '.');
    const std::string name = parts.back();
    parts.pop_back();
    size_t common = 0;
    while (common < open.size() && common < parts.size() &&
           open[common] == parts[common]) {
      ++common;
    }
    while (open.size() > common) {
      out << YAML::EndMap;
      open.pop_back();
    }
    while (open.size() < parts.size()) {
      out << YAML::Key << parts[open.size()] << YAML::Value << YAML::BeginMap;
      open.push_back(parts[open.size()]);
    }
    out << YAML::Key << name << YAML::Value;
    if (f.quote) out << YAML::DoubleQuoted;
    out << f.get(config);
  }
  while (!open.empty()) {
    out << YAML::EndMap;
    open.pop_back();
  }
  out << YAML::EndMap;
  return absl::StrCat(out.c_str(), "\n");
}

std::string DescribeFilters(const FilterConfig& f) {
  std::vector<std::string> on;
  if (f.significant_threshold > 0) {
    on.push_back(absl::StrCat("significant ",
                              FormatDouble(f.significant_threshold)));
  }
  if (f.kkt_fraction > 0) {
    on.push_back(absl::StrCat("kkt ", FormatDouble(f.kkt_fraction)));
  }
  if (f.value_encoding != "f32") {
    on.push_back(f.error_feedback ? f.value_encoding
                                  : f.value_encoding + " (no error feedback)");
  }
  if (f.codec != "none") on.push_back(f.codec);
  return on.empty() ? "none" : absl::StrJoin(on, ", ");
}

absl::Status Validate(const JobConfig& config) {
  // Every field's own range, for configs built in code rather than parsed.
  JobConfig scratch;
  for (const Field& f : Fields()) {
    PS_RETURN_IF_ERROR(f.set(YAML::Node(f.get(config)), &scratch));
  }
  PS_RETURN_IF_ERROR(CheckCrossField(config));
  if ((config.data.format == "libsvm" || config.data.format == "criteo") &&
      config.data.train.empty()) {
    return FieldError("data.train", absl::StrCat("required when data.format is ",
                                                 config.data.format));
  }
  // Regression (issue 8, "heartbeat_timeout_ms below heartbeat_ms is
  // accepted"): every node was then declared dead between two heartbeats.
  // Three heartbeats per timeout leave room for one lost or late beat.
  const ClusterConfig& cl = config.cluster;
  if (int64_t{cl.heartbeat_timeout_ms} < 3 * int64_t{cl.heartbeat_ms}) {
    return FieldError(
        "cluster.heartbeat_timeout_ms",
        absl::StrCat("must be >= 3 * cluster.heartbeat_ms (3 * ",
                     cl.heartbeat_ms, " = ", 3 * int64_t{cl.heartbeat_ms},
                     "), got ", cl.heartbeat_timeout_ms));
  }
  if (int64_t{cl.register_timeout_ms} < 2 * int64_t{cl.heartbeat_ms}) {
    return FieldError(
        "cluster.register_timeout_ms",
        absl::StrCat("must be >= 2 * cluster.heartbeat_ms (2 * ",
                     cl.heartbeat_ms, " = ", 2 * int64_t{cl.heartbeat_ms},
                     "), got ", cl.register_timeout_ms));
  }
  if (config.output.model_dir.empty()) {
    return FieldError("output.model_dir", "must not be empty");
  }
  // Checkpoints (issue 9): two answers to "where do we start from".
  if (config.fault_tolerance.resume &&
      !config.fault_tolerance.restore_from.empty()) {
    return FieldError("fault_tolerance.restore_from",
                      "excludes fault_tolerance.resume (set one of them)");
  }
  // Found by the workers only after the whole cluster had started.
  if (config.training.model == "mlp" && config.data.format != "criteo") {
    return FieldError("training.model",
                      absl::StrCat("mlp needs data.format criteo, got ",
                                   config.data.format));
  }
  if (config.training.early_stopping > 0 &&
      config.data.validation_fraction == 0) {
    return FieldError("training.early_stopping",
                      "needs data.validation_fraction > 0 (the rows it "
                      "watches)");
  }
  // Would silently record no curve.
  const bool has_test = config.data.format == "synthetic"
                            ? config.data.synthetic.test_rows > 0
                            : !config.data.test.empty();
  if (config.training.eval_interval_s > 0 && !has_test) {
    return FieldError(
        "training.eval_interval_s",
        absl::StrCat("needs a test set (",
                     config.data.format == "synthetic"
                         ? "data.synthetic.test_rows > 0"
                         : "data.test",
                     "), got ", FormatDouble(config.training.eval_interval_s)));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Checks against the machine, before any process starts.

namespace {

absl::Status PathError(absl::StatusCode code, const char* field,
                       const std::string& path, absl::string_view what) {
  return absl::Status(code,
                      absl::StrCat("config field ", field, ": ", path, ": ", what));
}

absl::StatusCode CodeOfErrno(int err) {
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      return absl::StatusCode::kNotFound;
    case EACCES:
    case EPERM:
      return absl::StatusCode::kPermissionDenied;
    case ENOSPC:
    case EDQUOT:
      return absl::StatusCode::kResourceExhausted;
    default:
      return absl::StatusCode::kFailedPrecondition;
  }
}

// A data file: exists, regular, readable.
absl::Status CheckDataFile(const char* field, const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    return PathError(CodeOfErrno(err), field, path, std::strerror(err));
  }
  if (S_ISDIR(st.st_mode)) {
    return PathError(absl::StatusCode::kInvalidArgument, field, path,
                     "is a directory, not a data file");
  }
  if (!S_ISREG(st.st_mode)) {
    return PathError(absl::StatusCode::kInvalidArgument, field, path,
                     "not a regular file");
  }
  if (st.st_size == 0) {
    return PathError(absl::StatusCode::kFailedPrecondition, field, path,
                     "is empty (0 bytes), no example to read");
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    return PathError(CodeOfErrno(err), field, path,
                     absl::StrCat("cannot be read: ", std::strerror(err)));
  }
  ::close(fd);
  return absl::OkStatus();
}

absl::Status CheckModelDir(const std::string& dir, int64_t min_free_bytes) {
  const char* field = "output.model_dir";
  std::error_code ec;
  if (std::filesystem::exists(dir, ec) &&
      !std::filesystem::is_directory(dir, ec)) {
    return PathError(absl::StatusCode::kFailedPrecondition, field, dir,
                     "exists and is not a directory");
  }
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return PathError(CodeOfErrno(ec.value()), field, dir,
                     absl::StrCat("cannot create it: ", ec.message()));
  }
  // Write and remove a probe file: the only reliable test (read-only
  // mounts, ACLs, root squash).
  const std::string probe =
      (std::filesystem::path(dir) / absl::StrCat(".ps_write_probe.", ::getpid()))
          .string();
  const int fd =
      ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    const int err = errno;
    return PathError(CodeOfErrno(err), field, dir,
                     absl::StrCat("not writable: ", std::strerror(err)));
  }
  const bool wrote = ::write(fd, "ps\n", 3) == 3;
  const int write_err = errno;
  ::close(fd);
  ::unlink(probe.c_str());
  if (!wrote) {
    return PathError(CodeOfErrno(write_err), field, dir,
                     absl::StrCat("not writable: ", std::strerror(write_err)));
  }
  struct statvfs vfs;
  if (::statvfs(dir.c_str(), &vfs) != 0) {
    const int err = errno;
    return PathError(CodeOfErrno(err), field, dir,
                     absl::StrCat("cannot read free space: ", std::strerror(err)));
  }
  const unsigned __int128 free_bytes =
      static_cast<unsigned __int128>(vfs.f_bavail) * vfs.f_frsize;
  if (free_bytes < static_cast<unsigned __int128>(min_free_bytes)) {
    return PathError(
        absl::StatusCode::kResourceExhausted, field, dir,
        absl::StrCat("only ", static_cast<uint64_t>(free_bytes) >> 20,
                     " MiB free, the model needs at least ",
                     min_free_bytes >> 20, " MiB"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckJobResources(const JobConfig& config,
                               const ResourceCheckOptions& options) {
  if (config.data.format != "synthetic") {
    PS_RETURN_IF_ERROR(CheckDataFile("data.train", config.data.train));
    if (!config.data.test.empty()) {
      PS_RETURN_IF_ERROR(CheckDataFile("data.test", config.data.test));
    }
  }
  return CheckModelDir(config.output.model_dir, options.min_free_bytes);
}

proto::OptimizerConfig OptimizerProto(const OptimizerConfig& o) {
  proto::OptimizerConfig p;
  p.set_name(o.name);
  p.set_learning_rate(o.learning_rate);
  p.set_alpha(o.alpha);
  p.set_beta(o.beta);
  p.set_l1(o.l1);
  p.set_l2(o.l2);
  p.set_initial_accumulator(o.initial_accumulator);
  return p;
}

OptimizerConfig OptimizerFromProto(const proto::OptimizerConfig& p) {
  OptimizerConfig c;
  c.name = p.name();
  c.learning_rate = p.learning_rate();
  c.alpha = p.alpha();
  c.beta = p.beta();
  c.l1 = p.l1();
  c.l2 = p.l2();
  c.initial_accumulator = p.initial_accumulator();
  return c;
}

}  // namespace ps
