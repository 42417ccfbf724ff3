"""The ORT-style corpus (tests/fixtures/ort_style/make_ort_style_graphs.py: small transformer subgraphs shaped
like ONNX Runtime's transformer-optimizer test generators) through the real CLI: every graph, optimized with
the transformer preset (its ORT test's num_heads/hidden_size, --dim values and input feeds), must pass parity
and reach the fused operator counts ORT's tests expect from ORT's optimizer, unless it is in KNOWN_MISSES.

  ort_style_test.py ONNXOPT_CLI                     # every graph
  ort_style_test.py ONNXOPT_CLI --graphs STEM ...   # these graphs

A count of a fused operator is reached at or above ORT's (an expected attention operator by any of Attention,
MultiHeadAttention and GroupQueryAttention; SimplifiedLayerNormalization by it and
SkipSimplifiedLayerNormalization together); a count of a plain ONNX operator ORT fuses away (Add,
LayerNormalization, Cast) at or below. A known miss that now fuses fails, so that KNOWN_MISSES stays true.

Exit 0 when every graph chosen passes; each failing graph is printed with the report's reasons."""
import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "ort_style"))
import make_ort_style_graphs  # noqa: E402

PARITY_LIMIT = 1e-4

# Graphs onnxopt does not fuse to ORT's counts yet: stem -> why.
KNOWN_MISSES = {
    "dit_attention_fp16_casts": "fp16 Casts around the scores: no pattern matches",
}

ATTENTION = ("Attention", "MultiHeadAttention", "GroupQueryAttention")
# An expected operator -> the operators that count towards it.
COUNTED_AS = {op: ATTENTION for op in ATTENTION}
COUNTED_AS["SimplifiedLayerNormalization"] = ("SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization")
# Operators ORT's fusions produce (reached at or above ORT's count); any other expected operator is a plain
# ONNX one the fusions remove (reached at or below).
FUSED_OPS = set(ATTENTION) | {"SkipLayerNormalization", "EmbedLayerNormalization", "SimplifiedLayerNormalization",
                              "SkipSimplifiedLayerNormalization", "Gelu", "FastGelu", "BiasGelu", "RotaryEmbedding"}


def histogram(report):
    """The optimized model's op counts, domains dropped."""
    counts = {}
    for key, value in report["optimized"]["op_histogram"].items():
        op = key.split("::")[-1]
        counts[op] = counts.get(op, 0) + int(value)
    return counts


def compare(expected, counts):
    """(reached, words): each expected operator as "OP got/expected", with what counted towards it."""
    groups = {}
    for op, want in expected.items():
        key = COUNTED_AS.get(op, (op,))
        groups.setdefault(key, []).append((op, want))
    reached, words = True, []
    for members, wanted in groups.items():
        want = sum(n for _, n in wanted)
        got = sum(counts.get(op, 0) for op in members)
        fused = wanted[0][0] in FUSED_OPS
        ok = got >= want if fused else got <= want
        reached &= ok
        name = "+".join(op for op, _ in wanted)
        as_ops = [f"{counts[op]} {op}" for op in members if counts.get(op) and op not in dict(wanted)]
        words.append(f"{name} {got}/{want}" + (f" (incl. {', '.join(as_ops)})" if as_ops else "")
                     + ("" if ok else " MISS"))
    return reached, words


def reasons_of(report, expected):
    """The report's missing-fusion lines for the expected operators (else all of them) and its warnings."""
    missing = report.get("transformer", {}).get("missing", [])
    wanted = {m for op in expected for m in COUNTED_AS.get(op, (op,))}
    mine = [m for m in missing if m.split(":")[0] in wanted]
    return (mine or missing) + list(report.get("warnings", []))


def check(cli, folder, stem, expected, params):
    """One graph: (passed, reached ORT's fusions, fused words, max error, reasons)."""
    config = {"benchmark": {"skip": True}}
    if "num_heads" in params:
        config["transformer"] = {"numHeads": params["num_heads"], "hiddenSize": params["hidden_size"]}
    config_file = os.path.join(folder, "cfg", stem + ".json")
    with open(config_file, "w") as f:
        json.dump(config, f)
    command = [cli, "optimize", os.path.join(folder, stem + ".onnx"), "-o", os.path.join(folder, "out", stem + ".onnx"),
               "--preset", "transformer", "--config", config_file, "--json"]
    for name, value in params.get("dims", {}).items():
        command += ["--dim", f"{name}={value}"]
    if "inputs" in params:
        command += ["--inputs", os.path.join(folder, params["inputs"])]
    ran = subprocess.run(command, capture_output=True, text=True)
    if ran.returncode != 0:
        lines = [line for line in ran.stderr.splitlines() if line.startswith("onnxopt:")]
        return False, False, [f"job failed (exit {ran.returncode})"], None, lines or ran.stderr.splitlines()[-3:]
    report = json.loads(ran.stdout)
    report = report.get("report", report)
    parity = report["parity"]
    errors = [o["max_abs_error"] for o in parity.get("outputs", [])]
    worst = max(errors) if errors else None
    reached, words = compare(expected, histogram(report))
    reasons = []
    if parity.get("skipped") or not parity.get("passed") or worst is None or worst >= PARITY_LIMIT:
        reasons.append(f"parity: passed {parity.get('passed')}, skipped {parity.get('skipped')}, max error {worst}"
                       + (f" ({parity['not_run']})" if parity.get("not_run") else ""))
    if stem in KNOWN_MISSES:
        if reached:
            reasons.append("now fuses: remove it from KNOWN_MISSES")
    elif not reached:
        reasons += ["below ORT's fusions"] + reasons_of(report, expected)
    return not reasons, reached, words, worst, reasons


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("cli")
    parser.add_argument("--graphs", nargs="+", metavar="STEM")
    args = parser.parse_args()
    unknown = sorted(set(args.graphs or ()) - {case[0] for case in make_ort_style_graphs.catalogue()})
    if unknown:
        parser.error("no such graph: " + ", ".join(unknown))
    results = {}
    with tempfile.TemporaryDirectory(prefix="onnxopt_ort_style_") as folder:
        stems = make_ort_style_graphs.write(folder, args.graphs)
        with open(os.path.join(folder, "expected.json")) as f:
            expected = json.load(f)
        with open(os.path.join(folder, "params.json")) as f:
            params = json.load(f)
        os.makedirs(os.path.join(folder, "cfg"))
        os.makedirs(os.path.join(folder, "out"))
        for stem in stems:
            results[stem] = check(args.cli, folder, stem, expected[stem + ".onnx"], params.get(stem + ".onnx", {}))
            ok, _, words, worst, reasons = results[stem]
            tag = ("ok  " if ok else "FAIL") + (" (known miss)" if stem in KNOWN_MISSES else "")
            error = "-" if worst is None else f"{worst:.1e}"
            print(f"{tag} {stem}: {', '.join(words)}; parity max error {error}"
                  + ("" if stem not in KNOWN_MISSES or not ok else " | " + KNOWN_MISSES[stem])
                  + ("" if ok else " | " + "; ".join(reasons)), flush=True)
    misses = sum(stem in KNOWN_MISSES for stem in results)
    print(f"{sum(r[1] for r in results.values())} of {len(results)} graphs reach ORT's fusions ({misses} known misses)"
          + ("" if all(r[0] for r in results.values()) else
             f"; {sum(not r[0] for r in results.values())} failing"))
    return 0 if all(r[0] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
