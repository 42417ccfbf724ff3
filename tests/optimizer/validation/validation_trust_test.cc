// The validator and benchmark a user decides on: tolerances per output and precision, padded masks
// and shape sets, supplied inputs, bisection of a parity failure to the pass that caused it, stable
// timing with its spread, the regression flag, peak memory, session tuning and the CUDA fallback flag.
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "optimizer/validation/benchmark.h"
#include "optimizer/validation/bisect.h"
#include "optimizer/model_io.h"
#include "optimizer/optimize.h"
#include "optimizer/validation/parity.h"
#include "tests/model_builder.h"

namespace onnxopt {
namespace {

namespace fs = std::filesystem;
using testing::FixturePath;
using testing::TempDir;


TEST(ToleranceTest, OutputBeatsConfigBeatsPrecisionDefault) {
  v1::ValidationConfig config;
  EXPECT_DOUBLE_EQ(ToleranceFor(config, "y", "fp32").atol, 1e-4);
  EXPECT_EQ(ToleranceFor(config, "y", "fp32").source, "fp32");
  EXPECT_DOUBLE_EQ(ToleranceFor(config, "y", "fp16").rtol, 1e-2);
  EXPECT_DOUBLE_EQ(ToleranceFor(config, "y", "int8").atol, 5e-2);
  (*config.mutable_precision_tolerances())["fp16"].set_atol(3e-3);
  EXPECT_DOUBLE_EQ(ToleranceFor(config, "y", "fp16").atol, 3e-3);
  EXPECT_DOUBLE_EQ(ToleranceFor(config, "y", "fp16").rtol, 1e-2) << "an unset field keeps the default";
  config.set_atol(0);
  EXPECT_DOUBLE_EQ(ToleranceFor(config, "y", "fp16").atol, 0) << "0 is a real, exact tolerance";
  EXPECT_EQ(ToleranceFor(config, "y", "fp16").source, "config");
  (*config.mutable_output_tolerances())["logits"].set_rtol(0.5);
  const Tolerance logits = ToleranceFor(config, "logits", "fp32");
  EXPECT_EQ(logits.source, "output");
  EXPECT_DOUBLE_EQ(logits.rtol, 0.5);
  EXPECT_DOUBLE_EQ(logits.atol, 0);

  v1::ValidationConfig bad;
  (*bad.mutable_precision_tolerances())["fp8"].set_atol(1);
  EXPECT_EQ(CheckValidationSettings(bad).code(), absl::StatusCode::kInvalidArgument);
  bad.Clear();
  (*bad.mutable_output_tolerances())["y"].set_atol(-1);
  EXPECT_EQ(CheckValidationSettings(bad).code(), absl::StatusCode::kInvalidArgument);
  bad.Clear();
  bad.set_mask_padding(1.0);
  EXPECT_EQ(CheckValidationSettings(bad).code(), absl::StatusCode::kInvalidArgument);
}

TEST(PrecisionTest, LowestPrecisionTheModelComputesIn) {
  onnx::GraphProto graph;
  *graph.add_node() = testing::MakeNode("Relu", {"x"}, {"y"});
  *graph.add_input() = testing::FloatValue("x", {2});
  *graph.add_output() = testing::FloatValue("y", {2});
  EXPECT_EQ(ModelPrecision(testing::MakeModel(graph)), "fp32");
  onnx::GraphProto half = graph;
  *half.add_node() = testing::WithIntAttribute(testing::MakeNode("Cast", {"y"}, {"h"}), "to", onnx::TensorProto::FLOAT16);
  EXPECT_EQ(ModelPrecision(testing::MakeModel(half)), "fp16");
  onnx::GraphProto quantized = graph;
  *quantized.add_node() = testing::MakeNode("QuantizeLinear", {"y", "s", "z"}, {"q"});
  EXPECT_EQ(ModelPrecision(testing::MakeModel(quantized)), "int8");
}

TEST(InputGeneratorTest, MasksArePaddedPerRowAndShapeSetsApply) {
  auto model = LoadModel(FixturePath("transformers/bert_opset14.onnx"));
  ASSERT_TRUE(model.ok());
  auto session = CreateSession({model->SerializeAsString(), {}}, {});
  ASSERT_TRUE(session.ok());
  v1::ValidationConfig config;
  config.set_mask_padding(0.5);
  (*config.mutable_dim_values())["batch"] = 2;
  (*config.add_shapes()->mutable_dim_values())["sequence"] = 8;
  (*config.add_shapes()->mutable_dim_values())["sequence"] = 20;
  const std::vector<DimValues> sets = ShapeSets(config);
  ASSERT_EQ(sets.size(), 2u);
  EXPECT_EQ(sets[1].at("batch"), 2) << "shape sets keep the common dim_values";
  auto inputs = GenerateInputs(**session, *model, config, sets[1], 0);
  ASSERT_TRUE(inputs.ok()) << inputs.status();
  for (size_t i = 0; i < inputs->names.size(); ++i) {
    EXPECT_EQ(inputs->shapes[inputs->names[i]], "2x20");
    if (inputs->names[i] != "attention_mask") continue;
    const int64_t* mask = inputs->values[i].GetTensorData<int64_t>();
    int ones[2] = {0, 0};
    for (int row = 0; row < 2; ++row) {
      for (int k = 0; k < 20; ++k) ones[row] += mask[row * 20 + k] != 0;
      for (int k = 1; k < 20; ++k) EXPECT_LE(mask[row * 20 + k], mask[row * 20 + k - 1]) << "zeros only at the end";
    }
    EXPECT_EQ(ones[0], 10) << "the first row loses half";
    EXPECT_EQ(ones[1], 15) << "the next one a quarter";
  }
}

TEST(SuppliedInputsTest, RealInputsAreUsedAndCheckedAgainstTheModel) {
  const fs::path dir = TempDir("supplied");
  auto model = LoadModel(FixturePath("cnn_tiny.onnx"));  // image [batch, 3, 32, 32]
  ASSERT_TRUE(model.ok());
  auto session = CreateSession({model->SerializeAsString(), {}}, {});
  ASSERT_TRUE(session.ok());
  onnx::TensorProto image = MakeFloatTensor("image", {2, 3, 32, 32}, testing::RandomFloats(2 * 3 * 32 * 32, 5));
  ASSERT_TRUE(WriteFileAtomically(dir / "image.pb", image.SerializeAsString()).ok());
  auto supplied = LoadSuppliedInputs({{{"image", dir / "image.pb"}}});
  ASSERT_TRUE(supplied.ok()) << supplied.status();
  v1::ParityReport report;
  auto reference = BuildParityReference(**session, *model, v1::ValidationConfig(), *supplied, RunContext(), &report);
  ASSERT_TRUE(reference.ok()) << reference.status();
  EXPECT_TRUE(report.supplied_inputs());
  EXPECT_EQ(report.input_shapes().at("image"), "2x3x32x32") << "the supplied batch of 2, not a generated 1";

  onnx::TensorProto wrong = MakeFloatTensor("image", {1, 3, 16, 16}, testing::RandomFloats(3 * 16 * 16, 6));
  ASSERT_TRUE(WriteFileAtomically(dir / "wrong.pb", wrong.SerializeAsString()).ok());
  auto mismatched = LoadSuppliedInputs({{{"image", dir / "wrong.pb"}}});
  ASSERT_TRUE(mismatched.ok());
  auto refused = BuildParityReference(**session, *model, v1::ValidationConfig(), *mismatched, RunContext(), &report);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("INPUT_MISMATCH"), std::string::npos) << refused.status();
  auto unknown = BuildParityReference(**session, *model, v1::ValidationConfig(), {{{"pixels", image}}}, RunContext(), &report);
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(WriteFileAtomically(dir / "junk.pb", "not a tensor \xff\xff\xff").ok());
  EXPECT_EQ(LoadSuppliedInputs({{{"image", dir / "junk.pb"}}}).status().code(), absl::StatusCode::kInvalidArgument);
  fs::remove_all(dir);
}

// With no tolerance at all, the LayerNorm fusion's different rounding fails parity; bisection
// names it, and the job returns the pipeline without it (which passes exactly), or fails if told.
TEST(BisectionTest, ATightToleranceNamesTheFusionThatChangedRounding) {
  const fs::path dir = TempDir("bisect");
  OptimizeRequest request;
  request.model_path = FixturePath("transformers/bert_opset14.onnx");
  request.output_dir = dir / "out";
  request.config.set_preset(v1::Pipelines::transformer);
  request.config.mutable_validation()->set_atol(0);
  request.config.mutable_validation()->set_rtol(0);
  request.config.mutable_benchmark()->set_skip(true);
  auto result = Optimize(request);
  ASSERT_TRUE(result.ok()) << result.status();
  const v1::ParityReport& parity = result->report.parity();
  const v1::Bisection& bisection = parity.bisection();
  ASSERT_TRUE(bisection.ran());
  ASSERT_GE(bisection.culprits_size(), 1);
  EXPECT_EQ(bisection.culprits(0).pass(), "fuse_layer_norm");
  EXPECT_GT(bisection.culprits(0).max_abs_error(), 0);
  bool layer_norm_added = false;
  for (const auto& node : bisection.culprits(0).added_nodes()) layer_norm_added |= node.rfind("LayerNormalization", 0) == 0;
  EXPECT_TRUE(layer_norm_added) << "the culprit's rewrite is listed";
  EXPECT_TRUE(bisection.recovered());
  EXPECT_FALSE(bisection.returned_original());
  EXPECT_TRUE(parity.passed()) << "the returned model passes even at atol = rtol = 0";
  for (const auto& pass : result->report.passes()) EXPECT_NE(pass.name(), "fuse_layer_norm") << "left out";
  EXPECT_EQ(result->report.optimized().op_histogram().count("LayerNormalization"), 0u);
  EXPECT_GT(result->report.optimized().op_histogram().count("com.microsoft::Attention"), 0u) << "other fusions stay";
  // The file returned is that model.
  auto saved = LoadModel(dir / "out" / "model.onnx");
  ASSERT_TRUE(saved.ok());
  EXPECT_EQ(CountNodes(saved->graph()), result->report.optimized().nodes());

  request.config.mutable_validation()->set_on_parity_failure(v1::ON_PARITY_FAILURE_FAIL);
  v1::Report partial;
  auto failed = Optimize(request, &partial);
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kAborted);
  EXPECT_NE(failed.status().message().find("fuse_layer_norm"), std::string::npos) << failed.status();
  EXPECT_EQ(partial.parity().bisection().culprits(0).pass(), "fuse_layer_norm");
  fs::remove_all(dir);
}

// The search itself, with a judge that fails any model holding an Attention node (as a model ONNX
// Runtime cannot load would be judged): the culprit is fuse_attention and the pipeline without it
// comes back.
TEST(BisectionTest, FindsThePassThatIntroducedWhatTheJudgeRejects) {
  auto original = LoadModel(FixturePath("transformers/gpt2_opset14.onnx"));
  ASSERT_TRUE(original.ok());
  v1::OptimizationConfig config;
  config.set_preset(v1::Pipelines::transformer);
  auto pipeline = BuildPipeline(config, DefaultPassRegistry());
  ASSERT_TRUE(pipeline.ok());
  onnx::ModelProto failed = *original;
  std::vector<v1::PassReport> run;
  ASSERT_TRUE(RunPipeline(*pipeline, &failed, {}, &run).ok());
  int judged = 0;
  ParityProbe probe = [&](const onnx::ModelProto& candidate, v1::ParityReport* parity) -> absl::StatusOr<bool> {
    ++judged;
    for (const auto& node : candidate.graph().node()) {
      if (node.op_type() == "Attention") {
        parity->add_outputs()->set_name("(model)");
        return false;
      }
    }
    return true;
  };
  auto result = BisectAndRecover(*original, *pipeline, failed, run, probe, RunContext());
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->bisection.culprits_size(), 1);
  EXPECT_EQ(result->bisection.culprits(0).pass(), "fuse_attention");
  EXPECT_TRUE(result->bisection.recovered());
  EXPECT_EQ(result->bisection.probes(), judged);
  int attention = 0, skip = 0;
  for (const auto& node : result->model.graph().node()) {
    attention += node.op_type() == "Attention";
    skip += node.op_type() == "SkipLayerNormalization";
  }
  EXPECT_EQ(attention, 0);
  EXPECT_EQ(skip, 4) << "the other fusions stay";
  // Binary search: far fewer probes than graph-changing pass runs.
  int changes = 0;
  for (const auto& report : run) changes += PassChangedGraph(report);
  EXPECT_LT(result->bisection.probes(), changes);
}

onnx::ModelProto MatMulChain(int depth) {
  onnx::GraphProto graph;
  std::string value = "x";
  for (int i = 0; i < depth; ++i) {
    const std::string w = absl::StrCat("w", i), out = absl::StrCat("h", i);
    *graph.add_node() = testing::MakeNode("MatMul", {value, w}, {out});
    *graph.add_initializer() = testing::FloatTensor(w, {64, 64}, testing::RandomFloats(64 * 64, i));
    value = out;
  }
  *graph.add_node() = testing::MakeNode("Identity", {value}, {"y"});
  *graph.add_input() = testing::FloatValue("x", {64, 64});
  *graph.add_output() = testing::FloatValue("y", {64, 64});
  return testing::MakeModel(graph, 13);
}

TEST(BenchmarkTest, TimesUntilStableReportsTheSpreadAndFlagsARegression) {
  SessionSettings settings;
  settings.intra_op_threads = 1;
  const onnx::ModelProto fast = MatMulChain(1), slow = MatMulChain(12);
  auto fast_session = CreateSession({fast.SerializeAsString(), {}}, settings);
  auto slow_session = CreateSession({slow.SerializeAsString(), {}}, settings);
  ASSERT_TRUE(fast_session.ok() && slow_session.ok());
  v1::OptimizationConfig config;
  config.mutable_benchmark()->set_time_budget_seconds(10);
  config.mutable_benchmark()->set_stability(0.05);
  v1::BenchmarkReport report;
  // "Optimized" is the slow one: a regression.
  ASSERT_TRUE(Benchmark(**fast_session, **slow_session, fast, config, RunContext(), &report).ok());
  ASSERT_EQ(report.shapes_size(), 1);
  const v1::ShapeBenchmark& shape = report.shapes(0);
  EXPECT_GE(shape.windows(), 3);
  EXPECT_EQ(shape.original().runs(), shape.optimized().runs()) << "interleaved in pairs";
  EXPECT_LT(shape.speedup(), 0.5);
  EXPECT_LE(shape.speedup_p10(), shape.speedup_p90());
  EXPECT_TRUE(report.regression());
  EXPECT_GT(shape.original().p95_ms(), 0);
  EXPECT_GT(shape.original().samples_ms_size(), 0);
  EXPECT_LE(shape.original().samples_ms_size(), kMaxLatencySamples);

  v1::BenchmarkReport faster;
  ASSERT_TRUE(Benchmark(**slow_session, **fast_session, slow, config, RunContext(), &faster).ok());
  EXPECT_GT(faster.speedup(), 2);
  EXPECT_FALSE(faster.regression());

  config.mutable_benchmark()->set_iterations(7);
  v1::BenchmarkReport fixed;
  ASSERT_TRUE(Benchmark(**fast_session, **slow_session, fast, config, RunContext(), &fixed).ok());
  EXPECT_EQ(fixed.original().runs(), 7) << "a fixed count is a fixed count";
}

// A report names every phase its benchmark timed slower than the original beyond the stability band,
// with its speedup; faster phases, phases within the band and phases that could not run are not named.
TEST(BenchmarkTest, SlowerPhasesAreNamedWithTheirSpeedup) {
  v1::Report report;
  v1::ShapeBenchmark* fast = report.mutable_benchmark()->add_shapes();
  fast->set_speedup(1.4);
  v1::ShapeBenchmark* slow = report.mutable_benchmark()->add_shapes();
  slow->set_speedup(0.91);
  (*slow->mutable_input_shapes())["input_ids"] = "1x512";
  (*slow->mutable_input_shapes())["attention_mask"] = "1x512";
  report.mutable_benchmark()->add_shapes()->set_speedup(0.99);  // within 2%: noise
  auto phase = [&](const char* name, int batch, int past, double speedup) {
    v1::GenerationPhase* p = report.mutable_generation()->add_phases();
    p->set_phase(name);
    p->set_batch(batch);
    p->set_past(past);
    p->set_speedup(speedup);
    return p;
  };
  phase("prefill", 1, 0, 1.2);
  phase("decode", 1, 512, 0.655);
  phase("decode", 4, 2048, 0)->set_error("out of memory");
  EXPECT_EQ(SlowerPhases(report, 0.02),
            (std::vector<std::string>{"shape 2 (attention_mask=1x512, input_ids=1x512) at 0.91x",
                                      "decode at batch 1 after 512 at 0.66x"}));
  EXPECT_TRUE(SlowerPhases(v1::Report(), 0.02).empty());
}

// The phase that decides which model comes back: a decoder's first prefill by default, its first decode
// when the result holds int4 weights, the named one when the config names it, and the shape sets where the
// benchmark did not time that phase.
TEST(BenchmarkTest, TheDecidingPhaseIsTheFirstPrefillUnlessNamedOrInt4) {
  v1::Report report;
  report.mutable_benchmark()->add_shapes()->set_speedup(1.3);
  report.mutable_benchmark()->set_speedup(1.3);
  report.mutable_benchmark()->set_regression(false);
  auto phase = [&](const char* name, int past, double speedup) {
    v1::GenerationPhase* p = report.mutable_generation()->add_phases();
    p->set_phase(name);
    p->set_batch(1);
    p->set_past(past);
    p->set_speedup(speedup);
  };
  phase("prefill", 0, 0.86);
  phase("decode", 512, 2.4);
  phase("prefill", 0, 1.5);  // a later batch's prefill does not decide
  v1::BenchmarkConfig config;
  DecidingPhase decided = JudgeDecidingPhase(report, config, /*int4_weights=*/false, 0.02);
  EXPECT_EQ(decided.name, "prefill");
  EXPECT_TRUE(decided.slower);
  EXPECT_EQ(decided.described, "prefill at batch 1 at 0.86x");
  decided = JudgeDecidingPhase(report, config, /*int4_weights=*/true, 0.02);
  EXPECT_EQ(decided.name, "decode");
  EXPECT_FALSE(decided.slower) << decided.described;
  config.set_deciding_phase("shape");
  EXPECT_FALSE(JudgeDecidingPhase(report, config, false, 0.02).slower);
  config.set_deciding_phase("decode");
  EXPECT_EQ(JudgeDecidingPhase(report, config, false, 0.02).described, "decode at batch 1 after 512 at 2.40x");
  report.mutable_generation()->mutable_phases(0)->set_speedup(0.99);  // within the band
  config.clear_deciding_phase();
  EXPECT_FALSE(JudgeDecidingPhase(report, config, false, 0.02).slower);

  v1::Report encoder;  // no phases: the shape sets decide, slower when the regression flag says so
  encoder.mutable_benchmark()->set_speedup(0.93);
  encoder.mutable_benchmark()->set_speedup_p90(0.97);
  encoder.mutable_benchmark()->set_regression(true);
  config.set_deciding_phase("prefill");
  decided = JudgeDecidingPhase(encoder, config, false, 0.02);
  EXPECT_EQ(decided.name, "shape");
  EXPECT_TRUE(decided.slower);
  EXPECT_EQ(decided.described, "the shape sets at 0.930x (90% of side-by-side runs below 0.970x)");

  config.set_deciding_phase("first token");
  EXPECT_EQ(CheckBenchmarkSettings(config).code(), absl::StatusCode::kInvalidArgument);
  config.set_deciding_phase("decode");
  EXPECT_TRUE(CheckBenchmarkSettings(config).ok());
}

TEST(BenchmarkTest, PeakMemoryGrowsWithTheModel) {
  SessionSettings settings;
  GeneratedInputs inputs;
  inputs.names.push_back("x");
  std::vector<float> x(64 * 64, 1.0f);
  Ort::MemoryInfo memory = Ort::MemoryInfo::CreateCpu(OrtArenaAllocator, OrtMemTypeDefault);
  const int64_t shape[] = {64, 64};
  inputs.values.push_back(Ort::Value::CreateTensor<float>(memory, x.data(), x.size(), shape, 2));
  // The first session of a process also sets up ONNX Runtime's environment and thread pools: the
  // benchmark measures after its own sessions exist, and so does this test.
  ASSERT_TRUE(MeasurePeakMemory({MatMulChain(1).SerializeAsString(), {}}, settings, inputs).ok());
  auto small = MeasurePeakMemory({MatMulChain(1).SerializeAsString(), {}}, settings, inputs);
  auto large = MeasurePeakMemory({MatMulChain(64).SerializeAsString(), {}}, settings, inputs);  // 1 MiB of weights
  ASSERT_TRUE(small.ok() && large.ok()) << small.status() << large.status();
  EXPECT_GT(*large, *small);
  EXPECT_GT(*large, 1 << 20);
}

TEST(OptimizeTest, SessionTuningNamesTheBestSettingsNextToTheModel) {
  const fs::path dir = TempDir("tuning");
  OptimizeRequest request;
  request.model_path = FixturePath("cnn_tiny.onnx");
  request.output_dir = dir;
  request.config.mutable_benchmark()->set_iterations(20);
  request.config.mutable_benchmark()->set_tune_session(true);
  request.config.mutable_benchmark()->set_time_budget_seconds(3);
  auto result = Optimize(request);
  ASSERT_TRUE(result.ok()) << result.status();
  const v1::SessionTuning& tuning = result->report.benchmark().tuning();
  EXPECT_GE(tuning.trials_size(), 12) << "thread counts x execution modes x optimization levels";
  EXPECT_GT(tuning.best().p50_ms(), 0);
  EXPECT_GE(tuning.gain(), 1.0);
  ASSERT_TRUE(fs::exists(dir / "ort_session.json"));
  EXPECT_EQ(result->files.back(), dir / "ort_session.json");
  auto json = ReadFile(dir / "ort_session.json");
  ASSERT_TRUE(json.ok());
  EXPECT_NE(json->find("\"graph_optimization_level\""), std::string::npos);
  EXPECT_GT(result->report.benchmark().original().peak_memory_bytes(), 0);
  fs::remove_all(dir);
}

TEST(OptimizeTest, CudaFallbackIsFlaggedWhenTheConfigAllowsIt) {
  if (ProviderFor(v1::DEVICE_CUDA).ok()) GTEST_SKIP() << "this machine has CUDA";
  const fs::path dir = TempDir("fallback");
  OptimizeRequest request;
  request.model_path = FixturePath("cnn_tiny.onnx");
  request.output_dir = dir;
  request.config.mutable_benchmark()->set_device(v1::DEVICE_CUDA);
  request.config.mutable_benchmark()->set_allow_cpu_fallback(true);
  request.config.mutable_benchmark()->set_iterations(5);
  auto result = Optimize(request);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_NE(result->report.benchmark().fallback().find("CUDA"), std::string::npos);
  EXPECT_EQ(result->report.benchmark().execution_provider(), "CPUExecutionProvider") << "the report says what ran";
  bool warned = false;
  for (const auto& warning : result->report.warnings()) warned |= warning.find("CPU") != std::string::npos;
  EXPECT_TRUE(warned);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace onnxopt
