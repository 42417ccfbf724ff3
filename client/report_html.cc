#include "client/report_html.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/report_format.h"
#include "absl/strings/str_join.h"

namespace onnxopt::client {
namespace {

constexpr char kOriginalColor[] = "#8c8c8c";
constexpr char kOptimizedColor[] = "#1f77b4";

constexpr char kStyle[] = R"css(
body { font-family: sans-serif; margin: 24px; color: #222; max-width: 1100px; }
h1 { font-size: 22px; } h2 { font-size: 18px; margin-top: 28px; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: 8px 0; font-size: 13px; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: right; white-space: nowrap; }
td.text { white-space: normal; }
th { background: #f4f4f4; } td.text, th.text { text-align: left; }
.badge { display: inline-block; padding: 3px 10px; border-radius: 4px; margin-right: 8px; color: #fff; }
.ok { background: #2e7d32; } .bad { background: #c62828; } .info { background: #555; }
.legend span { display: inline-block; width: 12px; height: 12px; margin: 0 4px 0 12px; vertical-align: middle; }
svg text { font-size: 11px; fill: #333; }
.warning { color: #c62828; }
)css";

// Runs once the page is laid out: counts the chart marks drawn with a real size.
constexpr char kLayoutProbe[] = R"js(
window.addEventListener('load', function () {
  var marks = document.querySelectorAll('svg.chart .mark');
  var drawn = 0;
  marks.forEach(function (m) { var r = m.getBoundingClientRect(); if (r.width > 0 && r.height > 0) drawn++; });
  document.body.setAttribute('data-rendered', 'charts=' + document.querySelectorAll('svg.chart').length +
                             ';marks=' + marks.length + ';drawn=' + drawn);
});
)js";

std::string Number(double value, int digits = 3) { return absl::StrFormat("%.*f", digits, value); }

std::string BytesOrDash(int64_t bytes) { return bytes <= 0 ? "-" : FormatBytes(bytes); }

std::string Badge(bool ok, const std::string& text) {
  return absl::StrCat("<span class=\"badge ", ok ? "ok" : "bad", "\">", HtmlEscape(text), "</span>");
}

std::string Legend() {
  return absl::StrCat("<div class=\"legend\"><span style=\"background:", kOriginalColor, "\"></span>original<span style=\"background:",
                      kOptimizedColor, "\"></span>optimized</div>");
}

std::string ShapeText(const google::protobuf::Map<std::string, std::string>& shapes) {
  std::vector<std::string> parts;
  for (const auto& [name, shape] : shapes) parts.push_back(absl::StrCat(name, "=", shape));
  std::sort(parts.begin(), parts.end());
  return absl::StrJoin(parts, ", ");
}

// Where a latency chart draws: its frame in pixels, and its axis in ms cut into kBins bins.
struct LatencyFrame {
  static constexpr int kWidth = 720, kHeight = 220, kLeft = 50, kBottom = 30, kBins = 40;
  static constexpr double kPlotWidth = kWidth - kLeft - 10, kPlotHeight = kHeight - kBottom - 10;
  double low = 0, high = 0, bin = 0;
  double XOf(double ms) const { return kLeft + (ms - low) / (high - low) * kPlotWidth; }
};

// The axis ends near the slower model's 90th percentile (at most the 99th of all runs), so that
// scheduler hiccups do not squeeze the distributions; slower runs count in the last bin.
LatencyFrame LatencyFrameOf(const v1::ShapeBenchmark& shape, const std::vector<double>& sorted_samples) {
  LatencyFrame frame;
  frame.low = sorted_samples.front();
  const double p99 = sorted_samples[static_cast<size_t>(0.99 * (sorted_samples.size() - 1))];
  const double tail = 1.5 * std::max(shape.original().p90_ms(), shape.optimized().p90_ms());
  frame.high = std::max(frame.low + 1e-6, std::min(p99, tail));
  frame.bin = (frame.high - frame.low) / LatencyFrame::kBins;
  return frame;
}

// Both models' histograms as bars side by side in each bin, scaled to the fullest bin.
void AppendLatencyBars(const v1::ShapeBenchmark& shape, const LatencyFrame& frame, std::string* svg) {
  constexpr int kBins = LatencyFrame::kBins;
  auto histogram = [&](const v1::LatencyStats& stats) {
    std::vector<int> counts(kBins, 0);
    for (double v : stats.samples_ms()) {
      counts[std::clamp(static_cast<int>((v - frame.low) / frame.bin), 0, kBins - 1)]++;
    }
    return counts;
  };
  const std::vector<int> counts[2] = {histogram(shape.original()), histogram(shape.optimized())};
  int peak = 1;
  for (const auto& c : counts) peak = std::max(peak, *std::max_element(c.begin(), c.end()));
  const double plot_w = LatencyFrame::kPlotWidth, plot_h = LatencyFrame::kPlotHeight;
  const char* colors[2] = {kOriginalColor, kOptimizedColor};
  const char* names[2] = {"original", "optimized"};
  const double bar_w = plot_w / kBins / 2;
  for (int m = 0; m < 2; ++m) {
    for (int b = 0; b < kBins; ++b) {
      if (counts[m][b] == 0) continue;
      const double h = plot_h * counts[m][b] / peak;
      absl::StrAppend(svg, absl::StrFormat(
                               "<rect class=\"mark bar %s\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
                               "fill=\"%s\" fill-opacity=\"0.85\"><title>%s: %d runs in %.3f-%.3f ms</title></rect>",
                               names[m], LatencyFrame::kLeft + b * plot_w / kBins + m * bar_w, 10 + plot_h - h,
                               bar_w, h, colors[m], names[m], counts[m][b], frame.low + b * frame.bin,
                               frame.low + (b + 1) * frame.bin));
    }
  }
}

// A dashed line at each model's p50 (at the axis' end where it lies beyond).
void AppendLatencyMedians(const v1::ShapeBenchmark& shape, const LatencyFrame& frame, std::string* svg) {
  const char* colors[2] = {kOriginalColor, kOptimizedColor};
  const char* names[2] = {"original", "optimized"};
  const v1::LatencyStats* stats[2] = {&shape.original(), &shape.optimized()};
  for (int m = 0; m < 2; ++m) {
    const double x = frame.XOf(std::min(frame.high, stats[m]->p50_ms()));
    absl::StrAppend(svg, absl::StrFormat("<line class=\"mark median %s\" x1=\"%.1f\" x2=\"%.1f\" y1=\"10\" "
                                         "y2=\"%.1f\" stroke=\"%s\" stroke-width=\"2\" stroke-dasharray=\"4 2\">"
                                         "<title>%s p50 %.3f ms</title></line>",
                                         names[m], x, x + 0.01, 10 + LatencyFrame::kPlotHeight, colors[m], names[m],
                                         stats[m]->p50_ms()));
  }
}

// The ms axis: its line, five ticks and its label.
void AppendLatencyAxis(const LatencyFrame& frame, std::string* svg) {
  constexpr int kWidth = LatencyFrame::kWidth, kHeight = LatencyFrame::kHeight;
  const double plot_h = LatencyFrame::kPlotHeight;
  absl::StrAppend(svg, absl::StrFormat("<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#333\"/>",
                                       LatencyFrame::kLeft, kWidth - 10, 10 + plot_h, 10 + plot_h));
  for (int t = 0; t <= 4; ++t) {
    const double ms = frame.low + (frame.high - frame.low) * t / 4;
    absl::StrAppend(svg, absl::StrFormat("<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%.3f</text>", frame.XOf(ms),
                                         kHeight - 12, ms));
  }
  absl::StrAppend(svg,
                  absl::StrFormat("<text x=\"%d\" y=\"%d\" text-anchor=\"end\">ms (slower runs in the last bin)</text>",
                                  kWidth - 10, kHeight - 1),
                  "</svg>");
}

// Histograms of both models' latencies on one axis, with p50 markers.
std::string LatencyChart(const v1::ShapeBenchmark& shape, int index) {
  constexpr int kWidth = LatencyFrame::kWidth, kHeight = LatencyFrame::kHeight;
  std::vector<double> all(shape.original().samples_ms().begin(), shape.original().samples_ms().end());
  all.insert(all.end(), shape.optimized().samples_ms().begin(), shape.optimized().samples_ms().end());
  if (all.empty()) return "<p>No latency samples.</p>";
  std::sort(all.begin(), all.end());
  const LatencyFrame frame = LatencyFrameOf(shape, all);
  std::string svg = absl::StrFormat(
      "<svg class=\"chart\" id=\"latency-chart-%d\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" role=\"img\" "
      "aria-label=\"latency distributions\">",
      index, kWidth, kHeight, kWidth, kHeight);
  AppendLatencyBars(shape, frame, &svg);
  AppendLatencyMedians(shape, frame, &svg);
  AppendLatencyAxis(frame, &svg);
  return svg;
}

// Node count after every pass run, as a step line with a point per run.
std::string PassChart(const v1::Report& report) {
  constexpr int kWidth = 720, kHeight = 220, kLeft = 50, kBottom = 30;
  if (report.passes_size() == 0) return "<p>No passes ran.</p>";
  int64_t peak = std::max<int64_t>(1, report.original().nodes());
  for (const auto& pass : report.passes()) peak = std::max({peak, pass.nodes_before(), pass.nodes_after()});
  const double plot_w = kWidth - kLeft - 10, plot_h = kHeight - kBottom - 10;
  const int runs = report.passes_size();
  auto x_of = [&](int i) { return kLeft + plot_w * i / std::max(1, runs); };
  auto y_of = [&](int64_t nodes) { return 10 + plot_h - plot_h * static_cast<double>(nodes) / static_cast<double>(peak); };
  std::string svg = absl::StrFormat(
      "<svg class=\"chart\" id=\"pass-chart\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" role=\"img\" "
      "aria-label=\"nodes after each pass\">",
      kWidth, kHeight, kWidth, kHeight);
  std::string path = absl::StrFormat("M %.1f %.1f", x_of(0), y_of(report.passes(0).nodes_before()));
  for (int i = 0; i < runs; ++i) {
    absl::StrAppend(&path, absl::StrFormat(" H %.1f V %.1f", x_of(i + 1), y_of(report.passes(i).nodes_after())));
  }
  absl::StrAppend(&svg, "<path d=\"", path, "\" fill=\"none\" stroke=\"", kOptimizedColor, "\" stroke-width=\"2\"/>");
  for (int i = 0; i < runs; ++i) {
    const v1::PassReport& pass = report.passes(i);
    const bool changed = pass.nodes_after() != pass.nodes_before() || pass.rewrites() > 0;
    absl::StrAppend(&svg, absl::StrFormat("<circle class=\"mark pass\" cx=\"%.1f\" cy=\"%.1f\" r=\"%d\" fill=\"%s\">"
                                          "<title>%s (sweep %d): %d -> %d nodes, %d rewrites</title></circle>",
                                          x_of(i + 1), y_of(pass.nodes_after()), changed ? 4 : 2,
                                          changed ? "#d62728" : kOptimizedColor, HtmlEscape(pass.name()),
                                          pass.iteration(), pass.nodes_before(), pass.nodes_after(), pass.rewrites()));
  }
  absl::StrAppend(&svg, absl::StrFormat("<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#333\"/>", kLeft,
                                        kWidth - 10, 10 + plot_h, 10 + plot_h));
  absl::StrAppend(&svg, absl::StrFormat("<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%d</text>", kLeft - 4, y_of(peak) + 4, peak),
                  absl::StrFormat("<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">0</text>", kLeft - 4, y_of(0)),
                  absl::StrFormat("<text x=\"%d\" y=\"%d\" text-anchor=\"end\">pass runs (red: changed the graph)</text>",
                                  kWidth - 10, kHeight - 8),
                  "</svg>");
  return svg;
}

// Operator counts before and after, as paired horizontal bars (the 30 most frequent).
std::string OpChart(const v1::Report& report) {
  std::map<std::string, std::pair<int64_t, int64_t>> ops;
  for (const auto& [op, count] : report.original().op_histogram()) ops[op].first = count;
  for (const auto& [op, count] : report.optimized().op_histogram()) ops[op].second = count;
  std::vector<std::pair<std::string, std::pair<int64_t, int64_t>>> rows(ops.begin(), ops.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) {
    return std::max(a.second.first, a.second.second) > std::max(b.second.first, b.second.second);
  });
  if (rows.size() > 30) rows.resize(30);
  if (rows.empty()) return "<p>No operators.</p>";
  int64_t peak = 1;
  for (const auto& row : rows) peak = std::max({peak, row.second.first, row.second.second});
  constexpr int kWidth = 720, kLeft = 260, kRow = 18;
  const int height = static_cast<int>(rows.size()) * kRow + 10;
  const double plot_w = kWidth - kLeft - 60;
  std::string svg = absl::StrFormat(
      "<svg class=\"chart\" id=\"op-chart\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" role=\"img\" "
      "aria-label=\"operator histogram\">",
      kWidth, height, kWidth, height);
  for (size_t i = 0; i < rows.size(); ++i) {
    const double y = 5 + kRow * static_cast<double>(i);
    const auto& [op, counts] = rows[i];
    absl::StrAppend(&svg, absl::StrFormat("<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%s</text>", kLeft - 6, y + 12,
                                          HtmlEscape(op)));
    const int64_t values[2] = {counts.first, counts.second};
    const char* colors[2] = {kOriginalColor, kOptimizedColor};
    const char* names[2] = {"original", "optimized"};
    for (int m = 0; m < 2; ++m) {
      if (values[m] == 0) continue;
      const double w = std::max(1.0, plot_w * static_cast<double>(values[m]) / static_cast<double>(peak));
      absl::StrAppend(&svg, absl::StrFormat("<rect class=\"mark op %s\" x=\"%d\" y=\"%.1f\" width=\"%.1f\" height=\"7\" "
                                            "fill=\"%s\"><title>%s %s: %d</title></rect>",
                                            names[m], kLeft, y + 2 + m * 8, w, colors[m], HtmlEscape(op), names[m], values[m]));
    }
    absl::StrAppend(&svg, absl::StrFormat("<text x=\"%.1f\" y=\"%.1f\">%d &#8594; %d</text>",
                                          kLeft + plot_w * static_cast<double>(std::max(values[0], values[1])) / peak + 6,
                                          y + 12, values[0], values[1]));
  }
  absl::StrAppend(&svg, "</svg>");
  return svg;
}

std::string LatencyRow(const char* name, const v1::LatencyStats& s) {
  return absl::StrCat("<tr><td class=\"text\">", name, "</td><td>", Number(s.p50_ms()), "</td><td>", Number(s.p90_ms()),
                      "</td><td>", Number(s.p95_ms()), "</td><td>", Number(s.p99_ms()), "</td><td>", Number(s.mean_ms()),
                      "</td><td>", Number(s.stddev_ms()), "</td><td>", Number(s.throughput_per_second(), 1), "</td><td>",
                      s.runs(), "</td><td>", BytesOrDash(s.peak_memory_bytes()), "</td></tr>");
}

// The document's head, the page title and the line that opens the verdict badges.
void AppendPageHead(const v1::Report& report, std::string* html) {
  const std::string title = report.job().empty() ? "local run" : report.job();
  absl::StrAppend(html, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>onnxopt report: ",
                  HtmlEscape(title), "</title><style>", kStyle, "</style></head><body>\n");
  absl::StrAppend(html, "<h1>onnxopt report: ", HtmlEscape(title), "</h1>\n<p>onnxopt ",
                  HtmlEscape(report.optimizer_version()), ", ", Number(report.total_seconds(), 2),
                  " s</p>\n<p id=\"verdict\">");
}

// Badges for parity, speedup, transformer fusion and a returned original, then the warnings.
void AppendVerdictAndWarnings(const v1::Report& report, std::string* html) {
  const auto& parity = report.parity();
  const auto& benchmark = report.benchmark();
  if (!parity.skipped()) {
    absl::StrAppend(html, Badge(parity.passed(), parity.passed() ? "parity passed" : "parity FAILED"));
  }
  if (!benchmark.skipped() && benchmark.speedup() > 0) {
    absl::StrAppend(html, Badge(benchmark.speedup() >= 1.0 && !benchmark.regression(),
                                absl::StrFormat("speedup %.3fx", benchmark.speedup())));
  }
  if (!report.transformer().family().empty()) {
    const auto& transformer = report.transformer();
    absl::StrAppend(html, Badge(transformer.fully_fused(),
                                absl::StrCat(transformer.family(),
                                             transformer.fully_fused() ? " fully fused" : " not fully fused")));
  }
  if (report.returned_original()) absl::StrAppend(html, Badge(false, "original model returned"));
  absl::StrAppend(html, "</p>\n");
  for (const auto& warning : report.warnings()) {
    absl::StrAppend(html, "<p class=\"warning\">", HtmlEscape(warning), "</p>\n");
  }
  for (const auto& line : report.normalizations()) {
    absl::StrAppend(html, "<p class=\"note\">normalized on loading: ", HtmlEscape(line), "</p>\n");
  }
}

// Nodes, initializers and bytes of both models, and the runtimes the result runs on.
void AppendModelSection(const v1::Report& report, std::string* html) {
  absl::StrAppend(html, "<h2>Model</h2><table><tr><th class=\"text\"></th><th>original</th><th>optimized</th></tr>",
                  "<tr><td class=\"text\">nodes</td><td>", report.original().nodes(), "</td><td>",
                  report.optimized().nodes(), "</td></tr><tr><td class=\"text\">initializers</td><td>",
                  report.original().initializers(), "</td><td>", report.optimized().initializers(),
                  "</td></tr><tr><td class=\"text\">size</td><td>", BytesOrDash(report.original().model_bytes()),
                  "</td><td>", BytesOrDash(report.optimized().model_bytes()), "</td></tr></table>\n");
  for (const auto& runtime : report.runtimes()) absl::StrAppend(html, "<p>Runs on: ", HtmlEscape(runtime), "</p>\n");
}

// Where and how the benchmark ran, and a fallback from the requested execution provider.
void AppendLatencySettings(const v1::BenchmarkReport& benchmark, std::string* html) {
  absl::StrAppend(html, "<p>", HtmlEscape(benchmark.device()), ", ", HtmlEscape(benchmark.execution_provider()),
                  ", ONNX Runtime ", HtmlEscape(benchmark.onnxruntime_version()), ", optimizations ",
                  HtmlEscape(benchmark.ort_optimization_level()), ", ", HtmlEscape(benchmark.execution_mode()),
                  benchmark.thread_spinning() ? "" : ", no thread spinning", ", warm-up ", benchmark.warmup_runs(),
                  "</p>\n");
  if (!benchmark.fallback().empty()) {
    absl::StrAppend(html, "<p class=\"warning\">", HtmlEscape(benchmark.fallback()), "</p>");
  }
}

// One input shape: its latency chart, both models' statistics and the speedup.
void AppendShapeLatencySection(const v1::ShapeBenchmark& shape, int index, std::string* html) {
  absl::StrAppend(html, "<h3>Shape ", index, ": ", HtmlEscape(ShapeText(shape.input_shapes())), "</h3>\n",
                  LatencyChart(shape, index), "\n<table><tr><th class=\"text\">model</th><th>p50 ms</th><th>p90 ms</th>"
                  "<th>p95 ms</th><th>p99 ms</th><th>mean ms</th><th>std ms</th><th>per s</th><th>runs</th>"
                  "<th>peak memory</th></tr>",
                  LatencyRow("original", shape.original()), LatencyRow("optimized", shape.optimized()), "</table>\n",
                  absl::StrFormat("<p>Speedup <b>%.3fx</b> (side-by-side runs %.3fx to %.3fx, 10th to 90th "
                                  "percentile); %s after %d windows, drift %.1f%%.</p>\n",
                                  shape.speedup(), shape.speedup_p10(), shape.speedup_p90(),
                                  shape.stable() ? "stable" : "not stable", shape.windows(),
                                  shape.median_drift() * 100));
}

// Every session-options trial, and the best against the defaults.
void AppendTuningSection(const v1::SessionTuning& tuning, std::string* html) {
  absl::StrAppend(html, "<h3>Session tuning</h3><table><tr><th>threads</th><th class=\"text\">execution</th>"
                        "<th class=\"text\">optimizations</th><th>p50 ms</th></tr>");
  for (const auto& trial : tuning.trials()) {
    absl::StrAppend(html, "<tr><td>", trial.intra_op_threads() > 0 ? absl::StrCat(trial.intra_op_threads()) : "default",
                    "</td><td class=\"text\">", HtmlEscape(trial.execution_mode()), "</td><td class=\"text\">",
                    HtmlEscape(trial.optimization_level()), "</td><td>",
                    trial.error().empty() ? Number(trial.p50_ms()) : HtmlEscape(trial.error()), "</td></tr>");
  }
  absl::StrAppend(html, "</table>",
                  absl::StrFormat("<p>Best: %s threads, %s, optimizations %s (%.3fx over the "
                                  "defaults, timed side by side).</p>\n",
                                  tuning.best().intra_op_threads() > 0 ? absl::StrCat(tuning.best().intra_op_threads())
                                                                       : "default",
                                  HtmlEscape(tuning.best().execution_mode()),
                                  HtmlEscape(tuning.best().optimization_level()), tuning.gain()));
}

void AppendLatencySection(const v1::BenchmarkReport& benchmark, std::string* html) {
  absl::StrAppend(html, "<h2>Latency</h2>\n");
  if (benchmark.skipped() || benchmark.shapes_size() == 0) {
    absl::StrAppend(html, "<p>Benchmark ", benchmark.skipped() ? "skipped" : "not run", ".</p>\n");
    return;
  }
  AppendLatencySettings(benchmark, html);
  absl::StrAppend(html, Legend());
  for (int i = 0; i < benchmark.shapes_size(); ++i) AppendShapeLatencySection(benchmark.shapes(i), i, html);
  if (benchmark.has_tuning()) AppendTuningSection(benchmark.tuning(), html);
}

// A phase's row: both models' time per token, or why it could not run.
void AppendGenerationPhaseRow(const v1::GenerationPhase& phase, std::string* html) {
  absl::StrAppend(html, "<tr><td class=\"text\">", HtmlEscape(phase.phase()), "</td><td>", phase.batch(), "</td><td>",
                  phase.new_tokens(), "</td><td>", phase.past(), "</td>");
  if (!phase.error().empty()) {
    absl::StrAppend(html, "<td class=\"text\" colspan=\"5\">could not run: ", HtmlEscape(phase.error()), "</td></tr>");
    return;
  }
  absl::StrAppend(html, "<td>", Number(phase.original_ms_per_token()), "</td><td>",
                  Number(phase.optimized_ms_per_token()), "</td><td>", Number(phase.speedup()), "x</td><td>",
                  Number(phase.original_tokens_per_second(), 1), "</td><td>",
                  Number(phase.optimized_tokens_per_second(), 1), "</td></tr>");
}

// Prefill and decode timed per phase, logits_to_keep, and the greedy generation's verdict.
void AppendGenerationSection(const v1::GenerationReport& generation, std::string* html) {
  absl::StrAppend(html, "<h2>Generation</h2>\n<p>Key/value cache: ", generation.past_inputs_size(),
                  " past inputs. Each phase timed for both models side by side.</p>\n<table><tr>"
                  "<th class=\"text\">phase</th><th>batch</th><th>new tokens</th><th>past</th>"
                  "<th>original ms/token</th><th>optimized ms/token</th><th>speedup</th>"
                  "<th>original tokens/s</th><th>optimized tokens/s</th></tr>");
  for (const auto& phase : generation.phases()) AppendGenerationPhaseRow(phase, html);
  absl::StrAppend(html, "</table>\n");
  if (generation.optimized_keeps_last_logits()) {
    absl::StrAppend(html, "<p>The optimized model was fed logits_to_keep = 1, as a generation loop feeds it: its "
                          "prefill projects the last position only, the original every position.</p>\n");
  }
  if (generation.steps_size() > 0) {
    absl::StrAppend(html, absl::StrFormat("<p>Greedy generation (batch %d, prompt %d, one row padded on the left): %d "
                                          "steps, %d identical from the start, top-1 agreement %.1f%%, minimum logits "
                                          "cosine %.6f: %s.</p>\n",
                                          generation.greedy_batch(), generation.prompt_tokens(),
                                          generation.steps_size(), generation.identical_steps(),
                                          100 * generation.top1_agreement(), generation.min_logits_cosine(),
                                          generation.passed() ? "passed" : "FAILED"));
  }
  if (!generation.note().empty()) {
    absl::StrAppend(html, "<p class=\"warning\">", HtmlEscape(generation.note()), "</p>\n");
  }
}

// An output's row: its errors against the tolerances, and the verdict.
void AppendParityOutputRow(const v1::OutputParity& output, std::string* html) {
  absl::StrAppend(html, "<tr><td class=\"text\">", HtmlEscape(output.name()), "</td><td>", output.shape_set(),
                  "</td><td>", output.sample(), "</td><td>", absl::StrFormat("%.3e", output.max_abs_error()),
                  "</td><td>", absl::StrFormat("%.3e", output.max_rel_error()), "</td><td>",
                  absl::StrFormat("%.4f%%", output.mismatch_fraction() * 100), "</td><td>",
                  absl::StrFormat("%.1e", output.atol()), "</td><td>", absl::StrFormat("%.1e", output.rtol()),
                  "</td><td class=\"text\">", output.passed() ? "ok" : "FAIL", HtmlEscape(output.note()), "</td></tr>");
}

// The passes a failed parity was traced to, with the nodes each removed and added.
void AppendBisectionSection(const v1::Bisection& bisection, std::string* html) {
  if (!bisection.ran()) return;
  absl::StrAppend(html, "<h3>Bisection</h3><p>", HtmlEscape(bisection.note()), " (", bisection.probes(),
                  " probes)</p><ul id=\"culprits\">");
  for (const auto& culprit : bisection.culprits()) {
    absl::StrAppend(html, "<li><b>", HtmlEscape(culprit.pass()), "</b> (pass run ", culprit.position(), ", sweep ",
                    culprit.iteration(), "): ", HtmlEscape(culprit.worst_output()),
                    absl::StrFormat(" off by %.3e", culprit.max_abs_error()), "; removed ",
                    HtmlEscape(absl::StrJoin(culprit.removed_nodes(), ", ")), "; added ",
                    HtmlEscape(absl::StrJoin(culprit.added_nodes(), ", ")), "</li>");
  }
  absl::StrAppend(html, "</ul>\n");
}

void AppendParitySection(const v1::ParityReport& parity, std::string* html) {
  absl::StrAppend(html, "<h2>Parity</h2>\n");
  if (parity.skipped()) {
    absl::StrAppend(html, "<p>Skipped.</p>\n");
    return;
  }
  absl::StrAppend(html, "<p>", parity.passed() ? "Passed" : "FAILED", " (", HtmlEscape(parity.precision()), ", ",
                  parity.supplied_inputs() ? "supplied inputs" : absl::StrCat("generated inputs, seed ", parity.seed()),
                  HtmlEscape(PaddedMasks(parity)),
                  ").</p>\n<table><tr><th class=\"text\">output</th><th>shape set</th><th>sample</th>"
                  "<th>max abs err</th><th>max rel err</th><th>mismatch</th><th>atol</th><th>rtol</th>"
                  "<th class=\"text\">verdict</th></tr>");
  for (const auto& output : parity.outputs()) AppendParityOutputRow(output, html);
  absl::StrAppend(html, "</table>\n");
  AppendBisectionSection(parity.bisection(), html);
}

// The LoRA adapter taken out of the model, how the model ran with it, and the modules it adapts.
void AppendAdapterSection(const v1::AdapterReport& adapter, std::string* html) {
  absl::StrAppend(html, "<h2>LoRA adapter</h2>\n<p>", HtmlEscape(adapter.file()), ": ", adapter.modules_size(),
                  " modules, ", adapter.bytes(), " bytes. With it active (ONNX Runtime's adapter API) the model ",
                  adapter.parity().skipped() ? "was not checked (validation skipped)"
                  : adapter.parity().passed() ? "matches the original"
                                              : "DOES NOT match the original",
                  absl::StrFormat("; with none active it runs the base model (outputs %.3e away).</p>\n<ul>",
                                  adapter.base_max_abs_diff()));
  for (const auto& module : adapter.modules()) absl::StrAppend(html, "<li>", HtmlEscape(module), "</li>");
  absl::StrAppend(html, "</ul>\n");
}

// The node count chart over the pass runs, and a row per run.
void AppendPipelineSection(const v1::Report& report, std::string* html) {
  absl::StrAppend(html, "<h2>Pipeline</h2>\n", PassChart(report),
                  "\n<table><tr><th class=\"text\">pass</th><th>sweep</th><th>ms</th><th>nodes</th><th>rewrites</th>"
                  "<th class=\"text\">left alone</th></tr>");
  for (const auto& pass : report.passes()) {
    std::vector<std::string> skipped;
    for (const auto& skip : pass.skipped()) skipped.push_back(absl::StrCat(skip.count(), "x ", skip.reason()));
    absl::StrAppend(html, "<tr><td class=\"text\">", HtmlEscape(pass.name()), "</td><td>", pass.iteration(),
                    "</td><td>", Number(pass.duration_seconds() * 1000), "</td><td>", pass.nodes_before(), " &#8594; ",
                    pass.nodes_after(), "</td><td>", pass.rewrites(), "</td><td class=\"text\">",
                    HtmlEscape(absl::StrJoin(skipped, "; ")), "</td></tr>");
  }
  absl::StrAppend(html, "</table>\n");
}

void AppendOperatorsSection(const v1::Report& report, std::string* html) {
  absl::StrAppend(html, "<h2>Operators</h2>\n", Legend(), OpChart(report), "\n");
}

// The transformer family detected, and its fused operators against those expected.
void AppendTransformerSection(const v1::TransformerReport& transformer, std::string* html) {
  if (transformer.family().empty()) return;
  absl::StrAppend(html, "<h2>Transformer fusion</h2><p>", HtmlEscape(transformer.family()), " (",
                  HtmlEscape(transformer.family_source()), "), ", transformer.layers(), " layers, ",
                  transformer.num_heads(), " heads, hidden ", transformer.hidden_size(),
                  "</p><table><tr><th class=\"text\">operator</th><th>fused</th><th>expected</th></tr>");
  for (const auto& [kind, count] : transformer.expected_ops()) {
    auto have = transformer.fused_kinds().find(kind);
    absl::StrAppend(html, "<tr><td class=\"text\">", HtmlEscape(kind), "</td><td>",
                    have == transformer.fused_kinds().end() ? 0 : have->second, "</td><td>", count, "</td></tr>");
  }
  absl::StrAppend(html, "</table><ul>");
  for (const auto& missing : transformer.missing()) absl::StrAppend(html, "<li>", HtmlEscape(missing), "</li>");
  absl::StrAppend(html, "</ul>\n");
}

}  // namespace

std::string HtmlEscape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string RenderReportHtml(const v1::Report& report) {
  std::string html;
  AppendPageHead(report, &html);
  AppendVerdictAndWarnings(report, &html);
  AppendModelSection(report, &html);
  AppendLatencySection(report.benchmark(), &html);
  if (report.has_generation()) AppendGenerationSection(report.generation(), &html);
  AppendParitySection(report.parity(), &html);
  if (report.has_adapter()) AppendAdapterSection(report.adapter(), &html);
  AppendPipelineSection(report, &html);
  AppendOperatorsSection(report, &html);
  AppendTransformerSection(report.transformer(), &html);
  absl::StrAppend(&html, "<script>", kLayoutProbe, "</script>\n</body></html>\n");
  return html;
}

}  // namespace onnxopt::client
