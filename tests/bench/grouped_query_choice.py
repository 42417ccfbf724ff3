"""Measures the choice fuse_attention makes for grouped-query attention on the CPU: MultiHeadAttention
with K and V repeated to the query heads (grouped_query: multi_head, the default) against
GroupQueryAttention with K and V at their own heads (grouped_query: group_query).

GroupQueryAttention is exact only for a causal mask without padding, so the decoder here is a LLaMA
block stack (tests/fixtures/transformer_families.py) exported with input_ids and position_ids and no
attention_mask. Each size is optimized twice, differing only in that parameter, and the two results are
timed side by side, interleaved, by `onnxopt compare` (batch 1 and 4, sequence 128, 2 threads).

  /usr/bin/python3 tests/bench/grouped_query_choice.py [--onnxopt build/client/onnxopt]

Needs Debian's python3-torch and python3-onnx."""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

import onnx
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures"))
import transformer_families as families  # noqa: E402

# hidden, query heads, key/value heads, intermediate: a small and a Qwen2-0.5B-like width.
SIZES = [(512, 8, 2, 1408), (896, 14, 2, 2432)]

# The transformer preset's passes (pass_registry.cc), once, with the parameter under test.
CLEANUPS = ["eliminate_identity", "eliminate_dropout", "eliminate_noop_ops", "fold_constants",
            "eliminate_common_subexpressions", "eliminate_duplicate_initializers", "eliminate_dead_nodes",
            "eliminate_unused_initializers"]
FUSIONS = ["canonicalize_swap_last_axes", "canonicalize_packed_head_split", "canonicalize_shape_reads",
           "unflatten_gemm", "fuse_layer_norm", "fuse_embed_layer_norm", "fuse_gelu", "fuse_skip_layer_norm",
           "fuse_rotary_embedding", "fuse_attention", "fuse_reshape_chains", "upstream_slice"]
PASSES = CLEANUPS + CLEANUPS + FUSIONS + CLEANUPS + FUSIONS + CLEANUPS  # the preset runs them to a fixed point


class CausalLlama(families.LlamaModel):
    """LlamaModel with a causal mask alone (no padding input), as a batch of equal-length prompts runs."""
    def forward(self, input_ids, position_ids):
        x = self.embed_tokens(input_ids)
        length = input_ids.shape[1]
        positions = torch.arange(length, device=input_ids.device)
        # transformers 5's masking_utils form: Where(allowed, 0, -inf) of a boolean causal condition.
        allowed = (positions[None, :] <= positions[:, None])[None, None]
        mask = torch.where(allowed, torch.tensor(0.0), torch.tensor(float("-inf")))
        cos, sin = self.rotary_emb(x, position_ids)
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        return self.norm(x)


def export(path, hidden, heads, kv_heads, intermediate):
    families.HIDDEN, families.HEADS, families.INTERMEDIATE, families.LAYERS = hidden, heads, intermediate, 2
    families.VOCAB = 1000
    torch.manual_seed(0)
    model = CausalLlama(kv_heads=kv_heads).eval()
    ids = torch.randint(0, families.VOCAB, (1, 16))
    positions = torch.arange(16)[None]
    torch.onnx.export(model, (ids, positions), path, input_names=["input_ids", "position_ids"],
                      output_names=["last_hidden_state"], opset_version=17,
                      dynamic_axes={"input_ids": {0: "batch", 1: "sequence"},
                                    "position_ids": {0: "batch", 1: "sequence"}})


def optimize(onnxopt, source, target, grouped, folder):
    passes = [{"name": name} for name in PASSES]
    for spec in passes:
        if spec["name"] == "fuse_attention":
            spec["params"] = {"grouped_query": grouped}
    config = os.path.join(folder, grouped + ".json")
    with open(config, "w") as f:
        json.dump({"passes": passes, "validation": {"skip": True}, "benchmark": {"skip": True}}, f)
    subprocess.run([onnxopt, "optimize", source, "-o", target, "--config", config], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    fused = onnx.load(target, load_external_data=False)
    ops = [node.op_type for node in fused.graph.node]
    return "%dx %s" % max((ops.count(op), op) for op in ("GroupQueryAttention", "MultiHeadAttention"))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--onnxopt", default=os.path.join(os.path.dirname(__file__), "..", "..", "build", "client",
                                                          "onnxopt"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        for hidden, heads, kv_heads, intermediate in SIZES:
            source = os.path.join(folder, "decoder.onnx")
            export(source, hidden, heads, kv_heads, intermediate)
            mha = os.path.join(folder, "mha.onnx")
            gqa = os.path.join(folder, "gqa.onnx")
            fused = (optimize(args.onnxopt, source, mha, "multi_head", folder),
                     optimize(args.onnxopt, source, gqa, "group_query", folder))
            for batch in (1, 4):
                out = subprocess.run([args.onnxopt, "compare", mha, gqa, "--dim", "batch=%d" % batch,
                                      "--dim", "sequence=128", "--json"], check=True, capture_output=True,
                                     text=True).stdout
                report = json.loads(out)
                bench = report.get("benchmark", {})
                original = bench.get("original", {}).get("p50Ms") or bench.get("original", {}).get("p50_ms")
                optimized = bench.get("optimized", {}).get("p50Ms") or bench.get("optimized", {}).get("p50_ms")
                parity = report.get("parity", {}).get("passed")
                print("hidden %4d, %2d heads / %d kv, batch %d x 128: %s %s ms, %s %s ms -> GQA/MHA speed %.3fx, "
                      "outputs match: %s" % (hidden, heads, kv_heads, batch, fused[0], original, fused[1], optimized,
                                             (original / optimized) if original and optimized else float("nan"),
                                             parity))


if __name__ == "__main__":
    main()
