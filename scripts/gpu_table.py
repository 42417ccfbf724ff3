#!/usr/bin/env python3
"""One table from `onnxopt optimize --json` reports (scripts/gpu_check.sh): per model the node counts,
parity with the largest error and the bound that judged it, the device-resident p50 of the original
and the optimized model, the optimized one with host copies and as a CUDA graph, and the speedups.

Usage: gpu_table.py REPORT.json [...]
"""
import json
import os
import sys


def ms(stats):
    value = (stats or {}).get("p50_ms")
    return f"{value:.3f}" if value else "-"


def parity_cell(parity):
    if parity.get("skipped"):
        return "skipped"
    outputs = parity.get("outputs", [])
    worst = max((o.get("max_abs_error", 0) for o in outputs), default=0)
    bound = max((max(o.get("atol", 0), o.get("noise_bound", 0)) for o in outputs), default=0)
    judged = sorted({o.get("judged_by", "") for o in outputs if o.get("judged_by")})
    verdict = "pass" if parity.get("passed") else "FAIL"
    return f"{verdict} {worst:.1e}<={bound:.1e} ({'/'.join(judged) or '-'})"


def row(path):
    report = json.load(open(path))
    bench = report.get("benchmark", {})
    graph = bench.get("cuda_graph", {})
    original, optimized = bench.get("original", {}), bench.get("optimized", {})
    speedup = bench.get("speedup", 0)
    graph_ms = ms(graph.get("optimized")) if graph.get("qualified") else ("no: " + graph.get("reason", "-"))[:28]
    best = optimized.get("p50_ms", 0)
    if graph.get("qualified") and graph.get("optimized", {}).get("p50_ms"):
        best = min(best, graph["optimized"]["p50_ms"])
    best_speedup = original.get("p50_ms", 0) / best if best else 0
    name = os.path.basename(path).replace(".report.json", "")
    nodes = f"{report.get('original', {}).get('nodes', '?')}->{report.get('optimized', {}).get('nodes', '?')}"
    return [name, nodes, parity_cell(report.get("parity", {})), ms(original), ms(optimized),
            ms(bench.get("optimized_with_copies")), graph_ms, f"{speedup:.2f}x", f"{best_speedup:.2f}x",
            "original" if report.get("returned_original") else ""]


def main(paths):
    header = ["model", "nodes", "parity (max err <= bound, judged by)", "orig ms", "opt ms", "opt+copies ms",
              "CUDA graph ms", "speedup", "best", "returned"]
    rows = [header] + [row(path) for path in paths]
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(header))]
    for r in rows:
        print("  ".join(str(cell).ljust(width) for cell, width in zip(r, widths)).rstrip())
    print("device-resident p50 at batch 1 x 128 (IoBinding); 'best' = original / the faster of opt and CUDA graph")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
