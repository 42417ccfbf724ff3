"""Generates GPT-2 decoders (tests/fixtures/transformer_families.py's GPT2Model, the way transformers
writes it) of a chosen size, exported by torch.onnx (TorchScript) at opset 17 with dynamic batch and
sequence, for onnxopt's large-model benchmark (large_model_benchmark.py).

TorchScript export time grows faster than the layer count (100 layers take minutes), so two layers
are exported and the second is then stacked in the ONNX graph until there are --layers: each copy
reads the one before it, its nodes and values renamed /h.N/..., its weights the second layer's plus
noise, so that no two layers are equal.

  make_large_decoder.py OUT.onnx --layers N --hidden H [--heads A] [--vocab V] [--external]

--external writes every tensor of 1 KiB or more to OUT.onnx.data, as exporters do for big models.
Needs Debian's python3-torch and python3-onnx (run with /usr/bin/python3)."""
import argparse
import os
import sys

import numpy
import onnx
import torch
from onnx import numpy_helper

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures"))
import transformer_families as families  # noqa: E402


def stack_layers(model, layers):
    """Repeats layer h.1 of a two-layer export until the model has `layers` layers."""
    graph = model.graph
    def in_layer(node):
        return node.name.startswith("/h.1/")
    template = [node for node in graph.node if in_layer(node)]
    produced = {output for node in template for output in node.output}
    previous_output = {i for node in template for i in node.input if i.startswith("/h.0/")}
    assert len(previous_output) == 1, previous_output
    previous_output = previous_output.pop()
    block_output = {i for node in graph.node if not in_layer(node) for i in node.input if i in produced}
    assert len(block_output) == 1, block_output
    block_output = block_output.pop()
    weights = {t.name: t for t in graph.initializer if t.name.startswith("h.1.")}
    rng = numpy.random.default_rng(1)
    last = block_output
    insert_at = max(i for i, node in enumerate(graph.node) if in_layer(node)) + 1
    new_nodes = []
    for copy in range(2, layers):
        def rename(value):
            return value.replace("/h.1/", f"/h.{copy}/") if "/h.1/" in value else f"{value}__h{copy}"
        for name, tensor in weights.items():
            values = numpy_helper.to_array(tensor)
            if values.dtype == numpy.float32:
                values = values + rng.normal(0, 0.1 * float(values.std()) + 1e-4, values.shape).astype(numpy.float32)
            graph.initializer.append(numpy_helper.from_array(values, name.replace("h.1.", f"h.{copy}.", 1)))
        for node in template:
            made = onnx.NodeProto()
            made.CopyFrom(node)
            made.name = node.name.replace("/h.1/", f"/h.{copy}/", 1)
            for i, value in enumerate(node.input):
                if value in produced:
                    made.input[i] = rename(value)
                elif value == previous_output:
                    made.input[i] = last
                elif value in weights:
                    made.input[i] = value.replace("h.1.", f"h.{copy}.", 1)
            for i, value in enumerate(node.output):
                made.output[i] = rename(value)
            new_nodes.append(made)
        last = rename(block_output)
    for node in graph.node:
        if not in_layer(node):
            for i, value in enumerate(node.input):
                if value == block_output:
                    node.input[i] = last
    nodes = list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes[:insert_at] + new_nodes + nodes[insert_at:])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--layers", type=int, required=True)
    parser.add_argument("--hidden", type=int, required=True)
    parser.add_argument("--heads", type=int, default=0, help="default: hidden / 64")
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--positions", type=int, default=128)
    parser.add_argument("--external", action="store_true")
    args = parser.parse_args()
    # The family modules read these module globals when they are built and run.
    families.HIDDEN = args.hidden
    families.HEADS = args.heads or max(1, args.hidden // 64)
    families.LAYERS = min(args.layers, 2)
    families.VOCAB = args.vocab
    families.POSITIONS = args.positions
    torch.manual_seed(0)
    model = families.GPT2Model().eval()
    ids = torch.randint(0, args.vocab, (1, 16))
    ones = torch.ones(1, 16, dtype=torch.int64)
    text = {0: "batch", 1: "sequence"}
    tmp = args.out + ".export.onnx"
    with torch.no_grad():
        torch.onnx.export(model, (ids, ones), tmp, opset_version=17, input_names=["input_ids", "attention_mask"],
                          output_names=["last_hidden_state"],
                          dynamic_axes={"input_ids": text, "attention_mask": text, "last_hidden_state": text})
    del model
    proto = onnx.load(tmp)
    os.remove(tmp)
    if args.layers > 2:
        stack_layers(proto, args.layers)
    if args.external:
        location = os.path.basename(args.out) + ".data"
        if os.path.exists(args.out + ".data"):
            os.remove(args.out + ".data")
        onnx.save_model(proto, args.out, save_as_external_data=True, all_tensors_to_one_file=True,
                        location=location, size_threshold=1024)
    else:
        onnx.save_model(proto, args.out)
    print(f"{args.out}: {len(proto.graph.node)} nodes")


if __name__ == "__main__":
    main()
