// ps_predict: predicts rows with a model a job saved, and exports models for
// serving. See kUsage and docs/predict.md.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "common/config.h"
#include "common/status_macros.h"
#include "data/data.h"
#include "kernels/backend.h"
#include "worker/predict.h"
#include "worker/worker_runner.h"

namespace ps {
namespace {

constexpr char kUsage[] = R"(usage: ps_predict --model DIR [--data FILE] [options]

Predicts every row of FILE with the logistic-regression model a job saved in
DIR (its output.model_dir), writing one probability per row, and prints the
rows' log loss, AUC and accuracy (17 significant digits; the same figures
as the job report's test_* for the same data). Or exports the model.

  --model DIR          model folder (default: output.model_dir of --config)
  --data FILE          rows to predict (default: data.test of --config; with
                       synthetic data, the job's generated test set)
  --format F           libsvm | criteo (default: data.format of --config,
                       else libsvm)
  --config FILE        the job's config; --set SECTION.FIELD=VALUE (repeatable)
                       overrides it as for ps_launch
  --skip_malformed     skip malformed lines instead of failing (counted)
  --out FILE           where the probabilities go, one per line ("-": stdout,
                       the default)
  --threads N          CPU threads (default 2)
  --export FILE        write the model for serving instead of predicting
  --export_format F    libsvm ("bias\t<w>", then "<index>\t<w>" per non-zero
                       weight) | keys ("<key>\t<values>"); default libsvm for
                       LIBSVM data, else keys
  --table T            the table to export (default 0; keys format for T > 0)
)";

struct Args {
  std::string model, data, format, config, out = "-", export_path,
      export_format;
  std::vector<std::string> sets;
  bool skip_malformed = false;
  bool skip_malformed_given = false;
  int threads = 2;
  int table = 0;
};

absl::StatusOr<Args> ParseArgs(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const absl::string_view flag = argv[i];
    auto value = [&](std::string* out) -> absl::Status {
      if (i + 1 >= argc) {
        return absl::InvalidArgumentError(
            absl::StrCat(flag, " needs a value"));
      }
      *out = argv[++i];
      return absl::OkStatus();
    };
    auto int_value = [&](int* out, int min) -> absl::Status {
      std::string s;
      PS_RETURN_IF_ERROR(value(&s));
      if (!absl::SimpleAtoi(s, out) || *out < min) {
        return absl::InvalidArgumentError(absl::StrCat(
            flag, ": expected an integer >= ", min, ", got '", s, "'"));
      }
      return absl::OkStatus();
    };
    if (flag == "--model") {
      PS_RETURN_IF_ERROR(value(&a.model));
    } else if (flag == "--data") {
      PS_RETURN_IF_ERROR(value(&a.data));
    } else if (flag == "--format") {
      PS_RETURN_IF_ERROR(value(&a.format));
    } else if (flag == "--config") {
      PS_RETURN_IF_ERROR(value(&a.config));
    } else if (flag == "--set") {
      PS_RETURN_IF_ERROR(value(&a.sets.emplace_back()));
    } else if (flag == "--out") {
      PS_RETURN_IF_ERROR(value(&a.out));
    } else if (flag == "--export") {
      PS_RETURN_IF_ERROR(value(&a.export_path));
    } else if (flag == "--export_format") {
      PS_RETURN_IF_ERROR(value(&a.export_format));
    } else if (flag == "--threads") {
      PS_RETURN_IF_ERROR(int_value(&a.threads, 1));
    } else if (flag == "--table") {
      PS_RETURN_IF_ERROR(int_value(&a.table, 0));
    } else if (flag == "--skip_malformed") {
      a.skip_malformed = a.skip_malformed_given = true;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown argument '", flag, "'"));
    }
  }
  if (a.model.empty() && a.config.empty()) {
    return absl::InvalidArgumentError("--model DIR (or --config) is needed");
  }
  if (!a.format.empty() && a.format != "libsvm" && a.format != "criteo") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--format: expected libsvm or criteo, got '", a.format, "'"));
  }
  return a;
}

absl::Status Run(const Args& args) {
  // The job's config supplies what the flags leave out.
  JobConfig config;
  if (!args.config.empty() || !args.sets.empty()) {
    PS_ASSIGN_OR_RETURN(config,
                        LoadJobConfigWithOverrides(args.config, args.sets));
  } else {
    config.data.format = "libsvm";
  }
  const std::string model_dir =
      args.model.empty() ? config.output.model_dir : args.model;
  if (!args.format.empty()) config.data.format = args.format;
  if (!args.data.empty()) {
    if (config.data.format == "synthetic") config.data.format = "libsvm";
    config.data.test = args.data;
  }
  if (args.skip_malformed_given) config.data.skip_malformed = true;

  PS_ASSIGN_OR_RETURN(SavedTable model, LoadModel(model_dir, args.table));
  std::fprintf(stderr, "ps_predict: model %s table %d: %zu keys of dim %d from %zu files\n",
               model_dir.c_str(), model.table, model.size(), model.dim,
               model.files.size());

  if (!args.export_path.empty()) {
    std::string name = args.export_format;
    if (name.empty()) {
      name = config.data.format == "libsvm" && args.table == 0 ? "libsvm"
                                                               : "keys";
    }
    PS_ASSIGN_OR_RETURN(ExportFormat format, ParseExportFormat(name));
    PS_RETURN_IF_ERROR(ExportModel(model, format, args.export_path));
    std::fprintf(stderr, "ps_predict: exported to %s (format %s)\n",
                 args.export_path.c_str(), name.c_str());
    return absl::OkStatus();
  }

  PS_ASSIGN_OR_RETURN(std::unique_ptr<RowReader> reader, OpenTestSet(config));
  if (reader == nullptr) {
    return absl::InvalidArgumentError(
        "no rows to predict: give --data FILE (or a --config with data.test)");
  }
  PS_ASSIGN_OR_RETURN(std::unique_ptr<ComputeBackend> backend,
                      CreateBackend("cpu", args.threads));
  std::FILE* out = stdout;
  const bool to_file = args.out != "-";
  if (to_file) {
    out = std::fopen(args.out.c_str(), "w");
    if (out == nullptr) {
      return absl::UnavailableError(absl::StrCat(
          "cannot create ", args.out, ": ", std::strerror(errno)));
    }
  }
  std::string buf;
  auto sink = [&](absl::Span<const float> prob,
                  absl::Span<const float>) -> absl::Status {
    buf.clear();
    // 9 significant digits: the float reads back exactly.
    for (float p : prob) absl::StrAppendFormat(&buf, "%.9g\n", p);
    if (std::fwrite(buf.data(), 1, buf.size(), out) != buf.size()) {
      return absl::UnavailableError(absl::StrCat(
          "cannot write ", args.out, ": ", std::strerror(errno)));
    }
    return absl::OkStatus();
  };
  absl::StatusOr<EvalMetrics> m =
      PredictRows(model, reader.get(), backend.get(), sink);
  const bool closed = to_file ? std::fclose(out) == 0 : std::fflush(out) == 0;
  PS_RETURN_IF_ERROR(m.status());
  if (!closed) {
    return absl::UnavailableError(absl::StrCat(
        "cannot write ", args.out, ": ", std::strerror(errno)));
  }
  const ReadStats& stats = reader->stats();
  std::fprintf(stderr,
               "ps_predict: %lld rows of %s: logloss %.17g auc %.17g "
               "accuracy %.17g",
               static_cast<long long>(m->n), reader->path().c_str(),
               m->logloss, m->auc, m->accuracy);
  if (stats.skipped > 0) {
    std::fprintf(stderr, " (%lld malformed lines skipped, the first at line %lld)",
                 static_cast<long long>(stats.skipped),
                 static_cast<long long>(stats.first_bad_line));
  }
  std::fputc('\n', stderr);
  return absl::OkStatus();
}

}  // namespace
}  // namespace ps

int main(int argc, char** argv) {
  absl::StatusOr<ps::Args> args = ps::ParseArgs(argc, argv);
  if (argc == 2 && (absl::string_view(argv[1]) == "--help" ||
                    absl::string_view(argv[1]) == "-h")) {
    std::fputs(ps::kUsage, stdout);
    return 0;
  }
  if (!args.ok()) {
    std::fprintf(stderr, "ps_predict: %s\n\n%s",
                 std::string(args.status().message()).c_str(), ps::kUsage);
    return 2;
  }
  absl::Status s = ps::Run(*args);
  if (!s.ok()) {
    std::fprintf(stderr, "ps_predict: %s\n", s.ToString().c_str());
    return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}
