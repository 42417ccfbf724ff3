"""Generates GPT-2 decoders (tests/fixtures/transformer_families.py's GPT2Model, the way transformers
writes it) of a chosen size, exported by torch.onnx (TorchScript) at opset 17 with dynamic batch and
sequence, for onnxopt's large-model benchmark (large_model_benchmark.py).

  make_large_decoder.py OUT.onnx --layers N --hidden H [--heads A] [--vocab V] [--external]

--external writes every tensor of 1 KiB or more to OUT.onnx.data, as exporters do for big models.
Needs Debian's python3-torch and python3-onnx (run with /usr/bin/python3)."""
import argparse
import os
import sys

import onnx
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures"))
import transformer_families as families  # noqa: E402


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
    families.LAYERS = args.layers
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
