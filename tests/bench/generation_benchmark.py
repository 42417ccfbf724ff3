"""The generation benchmark on a decoder large enough to time: a 122M-parameter Qwen2-style model with a
key/value cache (make_cache_decoder.py's defaults: hidden 768, 12 layers, 12 heads over 2 key/value
heads, vocabulary 32000), optimized by onnxopt in float32 (the transformer preset) and with int4
weights (MatMulNBits; --int4 lists block_size:accuracy_level pairs to try), each timed against the
original by `onnxopt compare` side by side, interleaved: prefill (128 new tokens, no past) and one-token
decode steps at past 128, 512 and 2048, at batch 1 and 4 (2 threads), then a 64-token greedy generation
compared token by token.

  /usr/bin/python3 tests/bench/generation_benchmark.py [--onnxopt build/client/onnxopt]
      [--int4 64:4,32:4,128:4,32:0] [--work DIR] [--quick]

--quick: batch 1, decode at past 512 only, 16 greedy tokens. Needs Debian's python3-torch and
python3-onnx; the models take 0.5 GB each in the work folder (a temporary one by default)."""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def run(command):
    return subprocess.run(command, check=True, capture_output=True, text=True).stdout


def optimize(onnxopt, source, target, config, folder, name):
    path = os.path.join(folder, name + ".json")
    with open(path, "w") as f:
        json.dump(config, f)
    run([onnxopt, "optimize", source, "-o", target, "--config", path])


def compare(onnxopt, original, candidate, generation, folder):
    path = os.path.join(folder, "compare.json")
    with open(path, "w") as f:
        json.dump({"benchmark": {"intra_op_threads": 2, "time_budget_seconds": 2, "generation": generation},
                   "validation": {"samples": 1}}, f)
    result = subprocess.run([onnxopt, "compare", original, candidate, "--config", path, "--json"],
                            capture_output=True, text=True)
    report = json.loads(result.stdout)
    return report.get("generation", {})


def show(label, generation):
    print("\n%s" % label)
    print("%-8s %5s %5s %12s %12s %8s %11s %11s" % ("phase", "batch", "past", "orig ms/tok", "opt ms/tok", "speedup",
                                                   "orig tok/s", "opt tok/s"))
    for phase in generation.get("phases", []):
        if phase.get("error"):
            print("%-8s %5d %5d could not run: %s" % (phase["phase"], phase["batch"], phase.get("past", 0),
                                                      phase["error"]))
            continue
        print("%-8s %5d %5d %12.3f %12.3f %7.3fx %11.1f %11.1f" % (
            phase["phase"], phase["batch"], phase.get("past", 0), phase["original_ms_per_token"],
            phase["optimized_ms_per_token"], phase["speedup"], phase["original_tokens_per_second"],
            phase["optimized_tokens_per_second"]))
    steps = generation.get("steps", [])
    print("greedy: %d steps, %d identical from the start, top-1 agreement %.1f%%, min logits cosine %.6f: %s%s" % (
        len(steps), generation.get("identical_steps", 0), 100 * generation.get("top1_agreement", 0),
        generation.get("min_logits_cosine", 0), "PASSED" if generation.get("passed") else "FAILED",
        (" (%s)" % generation["note"]) if generation.get("note") else ""))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--onnxopt", default=os.path.join(HERE, "..", "..", "build", "client", "onnxopt"))
    parser.add_argument("--int4", default="32:4,64:4,128:4,32:1", help="block_size:accuracy_level pairs")
    parser.add_argument("--work", help="folder for the models (default: a temporary one)")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    generation = {"batchSizes": [1], "decodePast": [512], "greedyTokens": 16} if args.quick else {}
    with tempfile.TemporaryDirectory() as temporary:
        folder = args.work or temporary
        os.makedirs(folder, exist_ok=True)
        original = os.path.join(folder, "decoder.onnx")
        if not os.path.exists(original):
            print(run([sys.executable, os.path.join(HERE, "make_cache_decoder.py"), original]).strip())
        fp32 = os.path.join(folder, "fp32.onnx")
        optimize(args.onnxopt, original, fp32, {"preset": "transformer", "benchmark": {"skip": True}}, folder, "fp32")
        show("float32, transformer preset (fused attention with the cache)",
             compare(args.onnxopt, original, fp32, generation, folder))
        for pair in filter(None, args.int4.split(",")):
            block, level = (int(v) for v in pair.split(":"))
            target = os.path.join(folder, "int4_%d_%d.onnx" % (block, level))
            # Validation skipped here: this model's weights are random, so its logits are flat and the
            # job's top-1 judge says little; the greedy check below reports cosine and agreement.
            optimize(args.onnxopt, original, target,
                     {"preset": "transformer", "benchmark": {"skip": True}, "validation": {"skip": True},
                      "precision": {"mode": "int4_weight_only",
                                    "int4": {"blockSize": block, "accuracyLevel": level}}}, folder, "int4")
            show("int4 weights, block_size %d, accuracy_level %d" % (block, level),
                 compare(args.onnxopt, original, target, generation, folder))


if __name__ == "__main__":
    main()
