"""tests/bench/deepen_decoder.py, which makes the 7B-class decoder of docs/benchmarks.md on a machine with
less memory than the model: a decoder exported with 2 layers by torch 1.13 and deepened to 6 must be the
decoder a 6-layer export would be — every layer wired to its own cache and to the one before it, each with
weights of its own written to their files — and must optimize and pass parity like one: attention fused in
6 of 6 layers, the greedy generation identical to the original's.

  deepen_decoder_test.py ONNXOPT_CLI SOURCE_DIR"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import numpy_helper


def main():
    cli, source = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory(prefix="onnxopt_deepen_") as folder:
        model_path = os.path.join(folder, "decoder.onnx")
        subprocess.run([sys.executable, os.path.join(source, "tests/bench/make_cache_decoder.py"), model_path,
                        "--hidden", "64", "--layers", "6", "--heads", "4", "--kv-heads", "2", "--intermediate", "128",
                        "--vocab", "100", "--export-layers", "2"], check=True, capture_output=True)
        model = onnx.load(model_path)  # external files read too
        onnx.checker.check_model(model)
        graph = model.graph
        inputs = [i.name for i in graph.input]
        outputs = [o.name for o in graph.output]
        for layer in range(6):
            assert f"past_key_values.{layer}.key" in inputs and f"past_key_values.{layer}.value" in inputs, inputs
            assert f"present.{layer}.key" in outputs and f"present.{layer}.value" in outputs, outputs
        per_layer = {}
        for node in graph.node:
            if node.name.startswith("/layers."):
                layer = int(node.name.split("/")[1].split(".")[1])
                per_layer[layer] = per_layer.get(layer, 0) + 1
        assert sorted(per_layer) == list(range(6)), per_layer
        assert per_layer[5] == per_layer[1], per_layer
        # Layer j reads layer j-1's residual stream, not layer 1's.
        produced_by = {out: node.name for node in graph.node for out in node.output}
        reads = {produced_by.get(name, "") for node in graph.node if node.name.startswith("/layers.4/")
                 for name in node.input}
        assert any(name.startswith("/layers.3/") for name in reads), sorted(reads)
        assert not any(name.startswith("/layers.1/") for name in reads), sorted(reads)
        # Every layer's projections are weights of their own, drawn as nn.Linear draws them.
        weights = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
        projections = [node.input[1] for node in graph.node if node.op_type == "MatMul" and node.input[1] in weights]
        assert len(projections) == 6 * 7 + 1, len(projections)
        assert len(set(projections)) == len(projections), "a weight shared between layers"
        q5 = [node.input[1] for node in graph.node if node.name == "/layers.5/self_attn/q_proj/MatMul"][0]
        q1 = [node.input[1] for node in graph.node if node.name == "/layers.1/self_attn/q_proj/MatMul"][0]
        bound = 1 / np.sqrt(64)
        uniform_std = bound / np.sqrt(3)  # of U(-bound, bound)
        assert np.abs(weights[q5]).max() <= bound, np.abs(weights[q5]).max()
        assert 0.9 * uniform_std < weights[q5].std() < 1.1 * uniform_std, weights[q5].std()
        assert not np.allclose(weights[q5], weights[q1])

        config = os.path.join(folder, "config.json")
        with open(config, "w") as f:
            json.dump({"benchmark": {"iterations": 3, "generation": {"batchSizes": [1], "decodePast": [8],
                                                                     "prefillTokens": 8, "runs": 3}}}, f)
        out = os.path.join(folder, "out", "model.onnx")
        ran = subprocess.run([cli, "optimize", model_path, "-o", out, "--config", config, "--json"],
                             capture_output=True, text=True)
        assert ran.returncode == 0, ran.stderr
        report = json.loads(ran.stdout)
        report = report.get("report", report)
        assert report["parity"]["passed"], report["parity"]
        transformer = report["transformer"]
        assert transformer["layers"] == 6 and transformer["fused_kinds"]["Attention"] == "6", transformer
        assert transformer["fully_fused"], transformer
        generation = report["generation"]
        assert generation["passed"] and generation["identical_steps"] == len(generation["steps"]), generation["note"]
    print("deepen_decoder: 6 layers from 2, parity and fusion as a 6-layer export")


if __name__ == "__main__":
    main()
