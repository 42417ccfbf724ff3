"""Makes a decoder exported by torch.onnx (TorchScript) deeper than the machine could export: the last
layer's nodes are repeated with fresh weights, written to disk one tensor at a time, so a 7B-class model
(~29 GB of float32) is made on a machine with less memory than that. make_cache_decoder.py calls it for
`--export-layers`; it reads only the graph, never the exported weights.

A layer is the nodes whose names start with "/layers.<i>/", as torch 1.13 scopes them. Copy j of the last
layer L reads what L reads, except:
  - the residual stream: L's first input from layer L-1 that is the output of L-1's last node becomes
    the output of copy j-1's last node (layer L's own last output for j = L+1);
  - the cache: past_key_values.L.key|value become past_key_values.j.key|value, and its presents
    present.j.key|value (new graph inputs and outputs, shaped like L's);
  - its weights: every float initializer only layer L reads gets a copy of its own, drawn as the exporter's
    model was (nn.Linear's default U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for matrices; vectors, i.e. norm
    weights and biases, copied from layer L).
What the layers share (the mask, the rotary tables computed once in layer 0, small constants) stays shared.
The nodes after the layers (final norm, LM head) then read the last copy's output. External data stays one
file per tensor, as torch writes a model over 2 GB."""
import os
import re

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper


def _layer_of(node):
    match = re.match(r"/layers\.(\d+)/", node.name)
    return int(match.group(1)) if match else None


def _external_location(tensor):
    for entry in tensor.external_data:
        if entry.key == "location":
            return entry.value
    return None


def _read_tensor(tensor, folder):
    """The values of a (small) initializer, inline or in its external file."""
    if tensor.data_location != TensorProto.EXTERNAL:
        return numpy_helper.to_array(tensor)
    entries = {e.key: e.value for e in tensor.external_data}
    dtype = onnx.mapping.TENSOR_TYPE_TO_NP_TYPE[tensor.data_type]
    count = int(np.prod(tensor.dims)) if tensor.dims else 1
    with open(os.path.join(folder, entries["location"]), "rb") as f:
        f.seek(int(entries.get("offset", 0)))
        return np.frombuffer(f.read(count * np.dtype(dtype).itemsize), dtype=dtype).reshape(tuple(tensor.dims))


def _write_external(name, values, folder, location):
    """An initializer whose bytes go to `folder/location`, written now."""
    with open(os.path.join(folder, location), "wb") as f:
        f.write(np.ascontiguousarray(values).tobytes())
    tensor = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=list(values.shape))
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", str(values.nbytes))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    return tensor


def _renamed(value_info, name):
    copy = onnx.ValueInfoProto()
    copy.CopyFrom(value_info)
    copy.name = name
    return copy


def _fresh_weight(tensor, rng):
    """A matrix drawn as nn.Linear draws its weight (stored transposed: [fan_in, fan_out])."""
    bound = 1.0 / np.sqrt(tensor.dims[0])
    values = rng.random(tuple(tensor.dims), dtype=np.float32)
    values *= 2 * bound
    values -= bound
    return values


def deepen(path, layers, seed=0, log=print):
    """Rewrites the model at `path` (its external files beside it) to have `layers` layers."""
    folder = os.path.dirname(os.path.abspath(path))
    model = onnx.load(path, load_external_data=False)
    graph = model.graph
    nodes = list(graph.node)
    by_layer = {}
    for index, node in enumerate(nodes):
        layer = _layer_of(node)
        if layer is not None:
            by_layer.setdefault(layer, []).append(index)
    last = max(by_layer)
    if layers <= last + 1:
        raise ValueError(f"the model has {last + 1} layers already")
    if last < 1:
        raise ValueError("export at least two layers: the residual stream is found between them")
    template = [nodes[i] for i in by_layer[last]]
    chain_in = nodes[by_layer[last - 1][-1]].output[0]
    chain_out = template[-1].output[0]
    produced = [out for node in template for out in node.output]
    initializers = {t.name: t for t in graph.initializer}
    readers = {}
    for node in nodes:
        for name in node.input:
            readers.setdefault(name, set()).add(_layer_of(node))
    own_weights = [name for name in dict.fromkeys(n for node in template for n in node.input)
                   if name in initializers and readers[name] == {last}
                   and initializers[name].data_type == TensorProto.FLOAT]
    past = [f"past_key_values.{last}.key", f"past_key_values.{last}.value"]
    presents = [f"present.{last}.key", f"present.{last}.value"]
    inputs = {i.name: i for i in graph.input}
    outputs = {o.name: o for o in graph.output}
    matmul_numbers = [int(m.group(1)) for m in (re.match(r"onnx::MatMul_(\d+)$", n) for n in initializers) if m]
    next_number = max(matmul_numbers, default=0) + 1
    rng = np.random.default_rng(seed)
    prefix = f"/layers.{last}/"

    new_nodes, new_inputs, new_outputs = [], [], []
    previous_out = chain_out
    for j in range(last + 1, layers):
        renamed = {chain_in: previous_out}
        for name in past:
            renamed[name] = name.replace(f".{last}.", f".{j}.")
            new_inputs.append(_renamed(inputs[name], renamed[name]))
        for name in produced:
            if name in presents:
                renamed[name] = name.replace(f".{last}.", f".{j}.")
                new_outputs.append(_renamed(outputs[name], renamed[name]))
            elif name.startswith(prefix):
                renamed[name] = f"/layers.{j}/" + name[len(prefix):]
            else:
                renamed[name] = f"{name}_layer{j}"
        for name in own_weights:
            source = initializers[name]
            if name.startswith(f"layers.{last}."):
                new_name = f"layers.{j}." + name[len(f"layers.{last}."):]
            else:
                new_name = f"onnx::MatMul_{next_number}" if name.startswith("onnx::MatMul_") else f"{name}_layer{j}"
                next_number += 1
            values = _fresh_weight(source, rng) if len(source.dims) >= 2 else _read_tensor(source, folder)
            if source.data_location == TensorProto.EXTERNAL or values.nbytes >= 1024:
                tensor = _write_external(new_name, values, folder, new_name.replace(":", "_"))
            else:
                tensor = numpy_helper.from_array(values, new_name)
            graph.initializer.append(tensor)
            renamed[name] = new_name
        for node in template:
            copy = onnx.NodeProto()
            copy.CopyFrom(node)
            copy.name = f"/layers.{j}/" + node.name[len(prefix):]
            copy.input[:] = [renamed.get(name, name) for name in node.input]
            copy.output[:] = [renamed[name] for name in node.output]
            new_nodes.append(copy)
        previous_out = renamed[chain_out]
        log(f"layer {j}: {len(template)} nodes, {len(own_weights)} weights written")

    after = nodes[by_layer[last][-1] + 1:]
    for node in after:
        node.input[:] = [previous_out if name == chain_out else name for name in node.input]
    del graph.node[:]
    graph.node.extend(nodes[:by_layer[last][-1] + 1] + new_nodes + after)
    # Inputs and outputs in layer order, as the exporter lists them.
    graph_inputs = [i for i in graph.input]
    graph_outputs = [o for o in graph.output]
    del graph.input[:]
    graph.input.extend(graph_inputs + new_inputs)
    del graph.output[:]
    graph.output.extend(graph_outputs + new_outputs)
    with open(path + ".tmp", "wb") as f:
        f.write(model.SerializeToString())
    os.replace(path + ".tmp", path)
