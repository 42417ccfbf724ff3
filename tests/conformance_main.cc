// onnxopt-conformance: the ONNX conformance suite (Debian's libonnx-testdata) through the default
// pipeline. For every model and reference data set: if ONNX Runtime reproduces the reference outputs
// with the original model, the optimized model must reproduce them too. Models ONNX Runtime cannot
// run (or gets wrong) before optimization are counted apart, never hidden. Every model must also
// survive parse -> IR -> serialize byte for byte.
//
//   onnxopt-conformance [--verbose] [--preset=NAME] DATA_ROOT...   (e.g. /usr/share/libonnx-testdata/data)
#include <algorithm>
#include <filesystem>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "optimizer/graph.h"
#include "optimizer/model_io.h"
#include "optimizer/ort_runtime.h"
#include "optimizer/pass_manager.h"
#include "optimizer/tensor_convert.h"
#include "optimizer/validation/parity.h"
#include "optimizer/validation/benchmark.h"

namespace fs = std::filesystem;
namespace onnxopt {
namespace {

// The ONNX backend test tolerances.
constexpr double kAtol = 1e-7;
constexpr double kRtol = 1e-3;

struct DataSet {
  std::vector<onnx::TensorProto> inputs;
  std::vector<onnx::TensorProto> outputs;
};

enum class Verdict { kPassed, kFailed, kOrtFailsOriginal, kUnsupported };

struct Outcome {
  Verdict verdict;
  std::string detail;
};

bool AllTensorIo(const onnx::GraphProto& graph) {
  for (const auto& value : graph.input()) {
    if (!value.type().has_tensor_type()) return false;
  }
  for (const auto& value : graph.output()) {
    if (!value.type().has_tensor_type()) return false;
  }
  return true;
}

absl::StatusOr<std::vector<DataSet>> ReadDataSets(const fs::path& dir) {
  std::vector<fs::path> set_dirs;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.is_directory() && absl::StartsWith(entry.path().filename().string(), "test_data_set_")) {
      set_dirs.push_back(entry.path());
    }
  }
  std::sort(set_dirs.begin(), set_dirs.end());
  std::vector<DataSet> sets;
  for (const auto& set_dir : set_dirs) {
    DataSet set;
    for (const char* kind : {"input", "output"}) {
      for (int i = 0;; ++i) {
        const fs::path file = set_dir / absl::StrCat(kind, "_", i, ".pb");
        if (!fs::exists(file)) break;
        absl::StatusOr<std::string> bytes = ReadFile(file);
        onnx::TensorProto tensor;
        if (!bytes.ok() || !tensor.ParseFromString(*bytes)) return absl::DataLossError(file.string());
        (std::string(kind) == "input" ? set.inputs : set.outputs).push_back(std::move(tensor));
      }
    }
    sets.push_back(std::move(set));
  }
  return sets;
}

// Runs `model` on every data set and checks the reference outputs; "" when all match.
absl::StatusOr<std::string> Check(const onnx::ModelProto& model, const std::vector<DataSet>& sets) {
  auto session = CreateSession({model.SerializeAsString(), {}}, {});
  if (!session.ok()) return session.status();
  std::vector<std::string> input_names;
  for (const auto& input : model.graph().input()) {
    bool is_initializer = false;
    for (const auto& init : model.graph().initializer()) is_initializer |= init.name() == input.name();
    if (!is_initializer) input_names.push_back(input.name());
  }
  std::vector<std::string> output_names;
  for (const auto& output : model.graph().output()) output_names.push_back(output.name());
  for (size_t s = 0; s < sets.size(); ++s) {
    const DataSet& set = sets[s];
    std::vector<const char*> feed_names;
    std::vector<Ort::Value> feeds;
    for (size_t i = 0; i < set.inputs.size() && i < input_names.size(); ++i) {
      // The suite stores 16-bit floats as uint16 bits: feed them as the type the model declares.
      onnx::TensorProto input = set.inputs[i];
      for (const auto& declared : model.graph().input()) {
        const int32_t type = declared.type().tensor_type().elem_type();
        if (declared.name() == input_names[i] && input.data_type() == onnx::TensorProto::UINT16 &&
            (type == onnx::TensorProto::BFLOAT16 || type == onnx::TensorProto::FLOAT16)) {
          input.set_data_type(type);
        }
      }
      auto value = TensorProtoToOrtValue(input);
      if (!value.ok()) return value.status();
      feed_names.push_back(input_names[i].c_str());
      feeds.push_back(*std::move(value));
    }
    std::vector<const char*> fetch_names;
    for (const auto& name : output_names) fetch_names.push_back(name.c_str());
    std::vector<Ort::Value> results;
    try {
      results = (*session)->Run(Ort::RunOptions{nullptr}, feed_names.data(), feeds.data(), feeds.size(),
                                fetch_names.data(), fetch_names.size());
    } catch (const Ort::Exception& e) {
      return absl::InternalError(e.what());
    }
    for (size_t i = 0; i < set.outputs.size() && i < results.size(); ++i) {
      auto expected = TensorProtoToOrtValue(set.outputs[i]);
      if (!expected.ok()) return expected.status();
      if (set.outputs[i].data_type() == onnx::TensorProto::STRING) {
        auto actual = OrtValueToTensorProto(results[i], "");
        if (!actual.ok() || actual->SerializeAsString() != set.outputs[i].SerializeAsString()) {
          // Compare element strings only (names and dims may be spelled differently).
          bool same = actual.ok() && actual->string_data_size() == set.outputs[i].string_data_size();
          for (int k = 0; same && k < actual->string_data_size(); ++k) same = actual->string_data(k) == set.outputs[i].string_data(k);
          if (!same) return absl::StrCat("data set ", s, " output ", output_names[i], ": strings differ");
        }
        continue;
      }
      v1::OutputParity parity;
      CompareOutput(*expected, results[i], kAtol, kRtol, &parity);
      if (!parity.passed()) {
        return absl::StrCat("data set ", s, " output ", output_names[i], ": max abs error ", parity.max_abs_error(),
                            parity.note().empty() ? "" : absl::StrCat(" (", parity.note(), ")"));
      }
    }
  }
  return std::string();
}

// parse -> IR -> serialize must give back the same bytes when no pass edits the graph.
bool RoundTripsLosslessly(const fs::path& path) {
  auto bytes = ReadFile(path);
  if (!bytes.ok()) return false;
  auto model = ParseModel(*bytes);
  if (!model.ok()) return false;
  {
    Graph graph(model->mutable_graph());
    if (!graph.Commit().ok()) return false;
  }
  return model->SerializeAsString() == *bytes;
}

Outcome RunCase(const fs::path& dir, const Pipeline& pipeline) {
  if (!RoundTripsLosslessly(dir / "model.onnx")) return {Verdict::kFailed, "IR round trip is not byte-identical"};
  auto model = LoadModel(dir / "model.onnx");
  if (!model.ok()) return {Verdict::kUnsupported, std::string(model.status().message())};
  if (!AllTensorIo(model->graph())) return {Verdict::kUnsupported, "sequence, map or optional inputs/outputs"};
  auto sets = ReadDataSets(dir);
  if (!sets.ok() || sets->empty()) return {Verdict::kUnsupported, "no readable reference data"};
  auto original = Check(*model, *sets);
  if (!original.ok()) return {Verdict::kOrtFailsOriginal, std::string(original.status().message())};
  if (!original->empty()) return {Verdict::kOrtFailsOriginal, *original};

  onnx::ModelProto optimized = *model;
  std::vector<v1::PassReport> reports;
  absl::Status ran = RunPipeline(pipeline, &optimized, {}, &reports);
  if (!ran.ok()) return {Verdict::kFailed, absl::StrCat("pipeline: ", ran.message())};
  auto after = Check(optimized, *sets);
  if (!after.ok()) return {Verdict::kFailed, absl::StrCat("optimized model does not run: ", after.status().message())};
  if (!after->empty()) return {Verdict::kFailed, *after};
  return {Verdict::kPassed, ""};
}

}  // namespace
}  // namespace onnxopt

int main(int argc, char** argv) {
  bool verbose = false;
  std::vector<fs::path> roots;
  onnxopt::v1::OptimizationConfig config;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--verbose") {
      verbose = true;
    } else if (absl::StartsWith(arg, "--preset=")) {
      onnxopt::v1::Pipelines::Preset preset;
      if (!onnxopt::v1::Pipelines::Preset_Parse(arg.substr(9), &preset)) {
        std::cerr << "unknown preset " << arg.substr(9) << "\n";
        return 2;
      }
      config.set_preset(preset);
    } else {
      roots.emplace_back(arg);
    }
  }
  if (roots.empty()) {
    std::cerr << "usage: onnxopt-conformance [--verbose] [--preset=NAME] DATA_ROOT...\n";
    return 2;
  }
  onnxopt::SetOrtLoggingLevel(ORT_LOGGING_LEVEL_FATAL);  // ONNX Runtime's own failures are counted, not logged
  auto pipeline = onnxopt::BuildPipeline(config, onnxopt::DefaultPassRegistry());
  if (!pipeline.ok()) {
    std::cerr << pipeline.status() << "\n";
    return 2;
  }
  std::vector<fs::path> cases;
  for (const auto& root : roots) {
    if (!fs::is_directory(root)) {
      std::cerr << "onnxopt-conformance: no test data at " << root << " (install libonnx-testdata)\n";
      return 2;
    }
    for (const auto& entry : fs::recursive_directory_iterator(root)) {
      if (entry.path().filename() == "model.onnx") cases.push_back(entry.path().parent_path());
    }
  }
  std::sort(cases.begin(), cases.end());
  std::map<onnxopt::Verdict, int> counts;
  for (const auto& dir : cases) {
    onnxopt::Outcome outcome = onnxopt::RunCase(dir, *pipeline);
    ++counts[outcome.verdict];
    if (outcome.verdict == onnxopt::Verdict::kFailed) {
      std::cout << "FAILED " << dir.string() << ": " << outcome.detail << "\n";
    } else if (verbose && outcome.verdict != onnxopt::Verdict::kPassed) {
      std::cout << (outcome.verdict == onnxopt::Verdict::kUnsupported ? "unsupported " : "ort-fails-original ")
                << dir.string() << ": " << outcome.detail << "\n";
    }
  }
  std::cout << "conformance (" << pipeline->ToString() << "): " << cases.size() << " models; " << counts[onnxopt::Verdict::kOrtFailsOriginal]
            << " that ONNX Runtime " << onnxopt::OrtVersion()
            << " cannot run or gets wrong before optimization, and "
            << counts[onnxopt::Verdict::kUnsupported] << " with sequence/optional I/O, are not counted\n";
  std::cout << counts[onnxopt::Verdict::kPassed] << " passed, " << counts[onnxopt::Verdict::kFailed] << " failed\n";
  return counts[onnxopt::Verdict::kFailed] == 0 ? 0 : 1;
}
