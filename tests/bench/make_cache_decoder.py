"""Generates a Qwen2-style decoder exported for generation with a key/value cache, the way transformers
and Optimum write one: Q/K/V projections with biases, rotary embeddings at the cache positions,
grouped-query attention (repeat_kv), RMSNorm, a SwiGLU MLP and an untied LM head; inputs `input_ids`
[batch, sequence], `attention_mask` [batch, total_sequence] and `past_key_values.{i}.key|value`
[batch, kv_heads, past_sequence, head_dim]; outputs `logits` and `present.{i}.key|value`
[batch, kv_heads, total_sequence, head_dim]. The mask is masking_utils': a key is seen where it is
not padding and at most the query's cache position, -inf elsewhere, with the NaN guard after Softmax
(a row padding masks entirely gives zeros). Exported by torch.onnx (TorchScript) at opset 17.

  make_cache_decoder.py OUT.onnx [--hidden 768 --layers 12 --heads 12 --kv-heads 2
                                  --intermediate 2048 --vocab 32000] [--seed 0] [--export-layers N]

`--export-layers N` exports N layers with torch and adds the others with deepen_decoder.py (the last
layer's graph repeated, fresh weights written to disk one tensor at a time): for models larger than the
machine's memory, e.g. 32 layers of Mistral-7B's shape (--hidden 4096 --heads 32 --kv-heads 8
--intermediate 14336 --vocab 32000), ~29 GB, made with ~9 GB of memory.

The defaults make a 122M-parameter model (the generation benchmark's); small sizes make test
fixtures (tests/fixtures/hf/cache_decoder_*.onnx: see tests/fixtures/hf/README.md). Needs Debian's
python3-torch and python3-onnx (run with /usr/bin/python3)."""
import argparse
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures"))
from transformer_families import RMSNorm, repeat_kv, rotate_half  # noqa: E402
from deepen_decoder import deepen  # noqa: E402


class Attention(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.head_dim = args.hidden // args.heads
        self.n_rep = args.heads // args.kv_heads
        self.scaling = self.head_dim ** -0.5
        self.q_proj = nn.Linear(args.hidden, args.heads * self.head_dim)
        self.k_proj = nn.Linear(args.hidden, args.kv_heads * self.head_dim)
        self.v_proj = nn.Linear(args.hidden, args.kv_heads * self.head_dim)
        self.o_proj = nn.Linear(args.heads * self.head_dim, args.hidden, bias=False)

    def forward(self, x, cos, sin, mask, past_key, past_value):
        batch, length, _ = x.shape
        shape = (batch, length, -1, self.head_dim)
        q = self.q_proj(x).view(shape).transpose(1, 2)
        k = self.k_proj(x).view(shape).transpose(1, 2)
        v = self.v_proj(x).view(shape).transpose(1, 2)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        present_key = torch.cat((past_key, k), dim=-2)
        present_value = torch.cat((past_value, v), dim=-2)
        keys = repeat_kv(present_key, self.n_rep)
        values = repeat_kv(present_value, self.n_rep)
        scores = torch.matmul(q, keys.transpose(2, 3)) * self.scaling + mask
        probs = nn.functional.softmax(scores, dim=-1)
        probs = torch.where(torch.isnan(probs), torch.tensor(0.0), probs)
        out = torch.matmul(probs, values).transpose(1, 2).reshape(batch, length, -1)
        return self.o_proj(out), present_key, present_value


class DecoderLayer(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.self_attn = Attention(args)
        self.input_layernorm = RMSNorm(hidden=args.hidden)
        self.post_attention_layernorm = RMSNorm(hidden=args.hidden)
        self.gate_proj = nn.Linear(args.hidden, args.intermediate, bias=False)
        self.up_proj = nn.Linear(args.hidden, args.intermediate, bias=False)
        self.down_proj = nn.Linear(args.intermediate, args.hidden, bias=False)

    def forward(self, x, cos, sin, mask, past_key, past_value):
        attended, present_key, present_value = self.self_attn(self.input_layernorm(x), cos, sin, mask, past_key,
                                                              past_value)
        x = x + attended
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(nn.functional.silu(self.gate_proj(h)) * self.up_proj(h)), present_key, present_value


class CacheDecoder(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.embed_tokens = nn.Embedding(args.vocab, args.hidden)
        head_dim = args.hidden // args.heads
        self.register_buffer("inv_freq", 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2).float() / head_dim)))
        self.layers = nn.ModuleList([DecoderLayer(args) for _ in range(args.layers)])
        self.norm = RMSNorm(hidden=args.hidden)
        self.lm_head = nn.Linear(args.hidden, args.vocab, bias=False)

    def forward(self, input_ids, attention_mask, *past):
        x = self.embed_tokens(input_ids)
        length = input_ids.shape[1]
        past_length = past[0].shape[2]
        cache_position = torch.arange(length) + past_length
        keys = torch.arange(past_length + length)
        seen = (keys[None, :] <= cache_position[:, None])[None, None] & (attention_mask[:, None, None, :] != 0)
        mask = torch.where(seen, torch.tensor(0.0), torch.tensor(float("-inf")))
        # transformers' rotary embedding: position ids [1, S] times inv_freq, as [1, S, D/2], doubled.
        position_ids = cache_position[None, :]
        inv_freq = self.inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1)
        freqs = (inv_freq @ position_ids[:, None, :].float()).transpose(1, 2)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        presents = []
        for i, layer in enumerate(self.layers):
            x, present_key, present_value = layer(x, cos, sin, mask, past[2 * i], past[2 * i + 1])
            presents += [present_key, present_value]
        return (self.lm_head(self.norm(x)), *presents)


def export_cache_decoder(model, args, output):
    """Exports `model` (a CacheDecoder of `args`' sizes) with the cache interface described above."""
    head_dim = args.hidden // args.heads
    batch, length, past_length = 2, 5, 3
    input_ids = torch.randint(0, args.vocab, (batch, length))
    attention_mask = torch.ones(batch, past_length + length, dtype=torch.int64)
    past = [torch.randn(batch, args.kv_heads, past_length, head_dim) for _ in range(2 * args.layers)]
    names = []
    for i in range(args.layers):
        names += [f"past_key_values.{i}.key", f"past_key_values.{i}.value"]
    presents = [name.replace("past_key_values", "present") for name in names]
    axes = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "total_sequence"},
            "logits": {0: "batch", 1: "sequence"}}
    axes.update({name: {0: "batch", 2: "past_sequence"} for name in names})
    axes.update({name: {0: "batch", 2: "total_sequence"} for name in presents})
    with torch.no_grad():
        torch.onnx.export(model.eval(), (input_ids, attention_mask, *past), output, opset_version=17,
                          input_names=["input_ids", "attention_mask", *names], output_names=["logits", *presents],
                          dynamic_axes=axes, do_constant_folding=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("output")
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--intermediate", type=int, default=2048)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--export-layers", type=int, default=0,
                        help="export this many layers with torch, then repeat the last one up to --layers")
    args = parser.parse_args()
    layers = args.layers
    if 0 < args.export_layers < layers:
        args.layers = args.export_layers
    torch.manual_seed(args.seed)
    model = CacheDecoder(args).eval()
    for name, parameter in model.named_parameters():
        if name.endswith(".bias"):
            nn.init.normal_(parameter, std=0.02)
    export_cache_decoder(model, args, args.output)
    head_dim = args.hidden // args.heads
    per_layer = sum(p.numel() for p in model.layers[-1].parameters())
    parameters = sum(p.numel() for p in model.parameters()) + (layers - args.layers) * per_layer
    if layers > args.layers:
        del model
        deepen(args.output, layers, seed=args.seed, log=lambda line: print(line, flush=True))
        args.layers = layers
    print(f"{args.output}: {parameters / 1e6:.1f}M parameters, {args.layers} layers, hidden {args.hidden}, "
          f"{args.heads} heads ({args.kv_heads} key/value), head size {head_dim}")


if __name__ == "__main__":
    main()
