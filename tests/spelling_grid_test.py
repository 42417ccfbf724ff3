"""The spelling grid (tests/fixtures/spelling_grid.py) through the real CLI: every cell exported by torch
1.13, optimized with the transformer preset, must fuse attention in every layer and match the original in
ONNX Runtime on a padded batch (two rows, a quarter of the mask zeroed) within 1e-4; the cells with a
cache at a prefill (past 0), a decode step and a chunk after a past, left-padded on even rows. A cell of a
known gap (KNOWN_GAPS) must still keep parity; it is listed as a gap, and a gap that fuses fails the run
until it is taken off the list.

  spelling_grid_test.py ONNXOPT_CLI [--sample N --seed S]   # a seeded sample of cells (CI)
  spelling_grid_test.py ONNXOPT_CLI --all [--table FILE]    # every cell; FILE gets the Markdown table
  spelling_grid_test.py ONNXOPT_CLI --cells NAME [NAME ...] # these cells

Exit 0 when every cell chosen passes; each failing cell is printed with the report's reasons."""
import argparse
import collections
import json
import os
import random
import subprocess
import sys
import tempfile
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures"))
import spelling_grid  # noqa: E402

PARITY_LIMIT = 1e-4
# (kind, mask or None for any): why attention is not fused there yet.
KNOWN_GAPS = {}  # none left: float biases with a past fuse since declared dims read as sums (dim_sums.h)
# The grid judges fusion and parity: the two-run benchmark, noisy on a loaded machine, only reports a
# slower phase (its default would return the original, whose attention is unfused).
CONFIG = {"preset": "transformer", "benchmark": {"iterations": 2, "onRegression": "ON_REGRESSION_REPORT"},
          "validation": {"dimValues": {"batch": 2, "sequence": 16}, "maskPadding": 0.25, "samples": 1}}


def fused_as(report):
    """How attention was fused: the operator, with RoPE where the rotation became RotaryEmbedding and
    "over given heads" where the core fused around a piece it did not take in."""
    ops = report["transformer"].get("fused_ops", {})
    kinds = [op for op in ("Attention", "MultiHeadAttention", "GroupQueryAttention") if op in ops]
    words = ["+".join(kinds) or "-"]
    if any(p["name"] == "fuse_rotary_embedding" and int(p.get("rewrites", "0")) > 0 for p in report["passes"]):
        words.append("RoPE")
    given = sum(int(p.get("counters", {}).get("fused_over_given_heads", "0")) for p in report["passes"])
    if given:
        words.append("over given heads")
    return " ".join(words)


def check(cli, folder, name):
    """One cell: (passed, fused "k of n", max error, reasons, fused as)."""
    model = os.path.join(folder, name + ".onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        spelling_grid.export(name, model)
    config = os.path.join(folder, "config.json")
    ran = subprocess.run([cli, "optimize", model, "-o", os.path.join(folder, "out", name + ".onnx"), "--config",
                          config, "--json"], capture_output=True, text=True)
    if ran.returncode != 0:
        lines = [line for line in ran.stderr.splitlines() if line.startswith("onnxopt:")]
        return False, "-", None, lines or ran.stderr.splitlines()[-3:], "-"
    report = json.loads(ran.stdout)
    report = report.get("report", report)
    transformer, parity = report["transformer"], report["parity"]
    fused = int(transformer["fused_kinds"].get("Attention", "0"))
    layers = int(transformer["layers"])
    errors = [o["max_abs_error"] for o in parity["outputs"]]
    worst = max(errors) if errors else None
    reasons = [m for m in transformer.get("missing", []) if m.startswith("Attention")]
    if not parity["passed"] or worst is None or worst >= PARITY_LIMIT:
        reasons.append(f"parity: max error {worst}")
    if not parity["padded_masks"] and parse_mask(name) != "causal_only":
        reasons.append("parity: no padded mask")
    # A merged decoder holds the decoder twice, with and without a past, each fused in its branch.
    expected_layers = spelling_grid.LAYERS * (2 if spelling_grid.parse(name)["kind"] == "merged" else 1)
    ok = fused == layers and layers == expected_layers and not reasons
    return ok, f"{fused} of {layers}", worst, reasons, fused_as(report)


def parse_mask(name):
    return spelling_grid.parse(name)["mask"]


def known_gap(name):
    cell = spelling_grid.parse(name)
    return KNOWN_GAPS.get((cell["kind"], None)) or KNOWN_GAPS.get((cell["kind"], cell["mask"]))


def judged(name, result):
    """(verdict, passed): "ok", "gap" (a known gap's cell that keeps parity) or "FAIL"."""
    ok, _, worst, reasons, _ = result
    gap = known_gap(name)
    if gap is None:
        return ("ok" if ok else "FAIL"), ok
    if ok:
        return "FAIL (the known gap fuses now: take it off KNOWN_GAPS)", False
    keeps_parity = worst is not None and worst < PARITY_LIMIT and not any(r.startswith("parity") for r in reasons)
    return ("gap" if keeps_parity else "FAIL"), keeps_parity


def table(results):
    """Markdown: one row per rotary x mask (cells passing out of cells, how attention was fused)."""
    lines = ["| kind | rotary | mask | pass | fused as |", "| --- | --- | --- | --- | --- |"]
    groups = collections.OrderedDict()
    for name, result in results.items():
        cell = spelling_grid.parse(name)
        groups.setdefault((cell["kind"], cell["rotary"], cell["mask"]), []).append((result[0], result[4], name))
    for (kind, rotary, mask), outcomes in groups.items():
        hows = sorted({how for _, how, _ in outcomes})
        gap = known_gap(outcomes[0][2])
        passing = f"{sum(ok for ok, _, _ in outcomes)} of {len(outcomes)}" + (f" (known gap: {gap})" if gap else "")
        lines.append(f"| {kind} | {rotary} | {mask} | {passing} | {'; '.join(hows)} |")
    worst = max((r[2] for r in results.values() if r[2] is not None), default=0.0)
    gaps = sum(judged(name, r)[0] == "gap" for name, r in results.items())
    lines.append("")
    lines.append(f"{sum(r[0] for r in results.values())} of {len(results)} cells pass"
                 + (f", {gaps} more of known gaps keep parity unfused" if gaps else "")
                 + f"; the largest parity error on a padded batch is {worst:.2e}.")
    return "\n".join(lines)


def sample(every, count, seed):
    """`count` cells in a seeded order, the first of them chosen so that every rotary, mask and kv spelling of
    each kind occurs at least once."""
    order = list(every)
    random.Random(seed).shuffle(order)
    chosen, seen = [], set()
    for name in order:
        cell = spelling_grid.parse(name)
        spellings = {(cell["kind"], axis, cell[axis]) for axis in ("rotary", "mask", "kv")}
        if not spellings <= seen:
            chosen.append(name)
            seen |= spellings
    chosen += [name for name in order if name not in chosen][:max(0, count - len(chosen))]
    return chosen


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("cli")
    parser.add_argument("--all", action="store_true")
    parser.add_argument("--sample", type=int, default=12)
    parser.add_argument("--seed", type=int, default=int(os.environ.get("ONNXOPT_GRID_SEED", "1")))
    parser.add_argument("--cells", nargs="+")
    parser.add_argument("--table")
    args = parser.parse_args()
    every = spelling_grid.cells()
    if args.cells:
        chosen = args.cells
    elif args.all:
        chosen = every
    else:
        chosen = sample(every, args.sample, args.seed)
    results = collections.OrderedDict()
    with tempfile.TemporaryDirectory(prefix="onnxopt_grid_") as folder:
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(CONFIG, f)
        for name in chosen:
            results[name] = check(args.cli, folder, name)
            _, fused, worst, reasons, how = results[name]
            verdict, passed = judged(name, results[name])
            print(f"{verdict:4} {name}: attention {fused} ({how}), max error {worst}"
                  + ("" if verdict == "ok" else " | " + "; ".join(reasons)), flush=True)
    summary = table(results)
    print(summary.splitlines()[-1])
    if args.table:
        with open(args.table, "w") as f:
            f.write(summary + "\n")
    return 0 if all(judged(name, r)[1] for name, r in results.items()) else 1


if __name__ == "__main__":
    sys.exit(main())
