"""Just enough of the ONNX protobuf wire format for the client: which external data files a model
names, rewriting those names, a TensorProto from a numpy array, and a tensor's name.

Why by hand: the `onnx` package is large and often missing (or a different protobuf major) where the
client runs; the few fields needed here have had the same numbers since IR version 3 (onnx.proto).
"""
import os
from typing import Callable, Dict, Iterator, List, Optional, Tuple

# Which length-delimited fields of each message hold messages that can (transitively) hold tensors:
# initializers, sparse initializers, tensor attributes (Constant values) and subgraphs (If, Loop,
# Scan), in the graph, the model's functions and its training graphs, as the server's loader walks them.
_CHILDREN: Dict[str, Dict[int, str]] = {
    "model": {7: "graph", 20: "training", 25: "function"},       # ModelProto
    "training": {1: "graph", 2: "graph"},                         # TrainingInfoProto
    "function": {7: "node", 11: "attribute"},                     # FunctionProto (node, attribute_proto)
    "graph": {1: "node", 5: "tensor", 15: "sparse"},              # GraphProto
    "node": {5: "attribute"},                                     # NodeProto
    "attribute": {5: "tensor", 6: "graph", 10: "tensor", 11: "graph", 22: "sparse", 23: "sparse"},
    "sparse": {1: "tensor", 2: "tensor"},                         # SparseTensorProto values, indices
}
_TENSOR_NAME, _TENSOR_EXTERNAL_DATA, _TENSOR_DATA_LOCATION = 8, 13, 14  # TensorProto
_EXTERNAL = 1                                                             # TensorProto.DataLocation


class WireError(ValueError):
    """Bytes that are not a well-formed protobuf message."""


def _varint(data: memoryview, pos: int) -> Tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise WireError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise WireError("varint too long")


def _fields(data: memoryview) -> Iterator[Tuple[int, int, int, int, int, int]]:
    """(field number, wire type, start of the key, start of the value, end, varint value) per field."""
    pos = 0
    while pos < len(data):
        start = pos
        key, pos = _varint(data, pos)
        field, wire = key >> 3, key & 7
        value = 0
        if field == 0:
            raise WireError("field number 0")
        if wire == 0:
            value, pos = _varint(data, pos)
            value_start = end = pos
        elif wire == 1:
            value_start, end = pos, pos + 8
        elif wire == 2:
            length, value_start = _varint(data, pos)
            end = value_start + length
        elif wire == 5:
            value_start, end = pos, pos + 4
        else:  # groups (3, 4) are not in ONNX's protos
            raise WireError(f"unexpected wire type {wire}")
        if end > len(data):
            raise WireError("truncated field")
        pos = end
        yield field, wire, start, value_start, end, value


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field_bytes(field: int, payload: bytes) -> bytes:
    return _encode_varint(field << 3 | 2) + _encode_varint(len(payload)) + payload


def _rewrite(data: memoryview, kind: str, on_tensor: Callable[[memoryview], Optional[bytes]]) -> Optional[bytes]:
    """Calls on_tensor on every TensorProto inside `data` (a message of `kind`). Returns the message
    re-encoded where on_tensor returned new bytes for a tensor, None where nothing changed: untouched
    fields are copied byte for byte, so a model is never re-serialized just to be read."""
    if kind == "tensor":
        return on_tensor(data)
    children = _CHILDREN[kind]
    pieces: List[bytes] = []
    copied = 0
    for field, wire, start, value_start, end, _ in _fields(data):
        if wire != 2 or field not in children:
            continue
        replaced = _rewrite(data[value_start:end], children[field], on_tensor)
        if replaced is not None:
            pieces += [bytes(data[copied:start]), _field_bytes(field, replaced)]
            copied = end
    if not pieces:
        return None
    pieces.append(bytes(data[copied:]))
    return b"".join(pieces)


def _external_entries(tensor: memoryview) -> Tuple[bool, List[Tuple[str, str, int, int]]]:
    """Whether the tensor's data_location is EXTERNAL, and its external_data entries as
    (key, value, start, end) with the entry's field span."""
    external, entries = False, []
    for field, wire, start, value_start, end, value in _fields(tensor):
        if field == _TENSOR_DATA_LOCATION and wire == 0:
            external = value == _EXTERNAL
        elif field == _TENSOR_EXTERNAL_DATA and wire == 2:
            entry, strings = tensor[value_start:end], {1: "", 2: ""}  # StringStringEntryProto key, value
            for entry_field, entry_wire, _, entry_start, entry_end, _ in _fields(entry):
                if entry_wire == 2 and entry_field in strings:
                    strings[entry_field] = bytes(entry[entry_start:entry_end]).decode("utf-8", "replace")
            entries.append((strings[1], strings[2], start, end))
    return external, entries


def external_data_locations(model: bytes) -> List[str]:
    """The "location" of every tensor whose data is EXTERNAL, sorted, each once ("" for a tensor that
    names none, which check_location refuses)."""
    found = set()

    def visit(tensor: memoryview) -> None:
        external, entries = _external_entries(tensor)
        if external:
            locations = [value for key, value, _, _ in entries if key == "location"]
            found.add(locations[-1] if locations else "")
        return None

    _rewrite(memoryview(model), "model", visit)
    return sorted(found)


def relocate_external_data(model: bytes, old: str, new: str) -> bytes:
    """The model with every external data location `old` renamed to `new` (what the CLI does when it
    saves model.onnx.data as OUT.data beside OUT)."""
    replacement = _field_bytes(1, b"location") + _field_bytes(2, new.encode())  # StringStringEntryProto

    def visit(tensor: memoryview) -> Optional[bytes]:
        _, entries = _external_entries(tensor)
        spans = [(start, end) for key, value, start, end in entries if key == "location" and value == old]
        if not spans:
            return None
        pieces, copied = [], 0
        for start, end in spans:
            pieces += [bytes(tensor[copied:start]), _field_bytes(_TENSOR_EXTERNAL_DATA, replacement)]
            copied = end
        pieces.append(bytes(tensor[copied:]))
        return b"".join(pieces)

    rewritten = _rewrite(memoryview(model), "model", visit)
    return model if rewritten is None else rewritten


def check_location(folder: str, location: str) -> str:
    """The file an external data location names: a relative path to a regular file inside `folder`
    (no "..", not absolute, no symbolic link, also after resolving links), as the server requires."""
    def refuse(why: str):
        raise ValueError(f"EXTERNAL_DATA_PATH: the model's external data location '{location}' {why}")

    if not location or "\0" in location:
        refuse("is empty or malformed")
    if os.path.isabs(location) or location.startswith(("/", "\\")):
        refuse("is an absolute path; it must be relative to the model's folder")
    if ".." in location.replace("\\", "/").split("/"):
        refuse("leaves the model's folder")
    path = os.path.join(folder, location)
    if os.path.islink(path):
        refuse("is a symbolic link; only regular files inside the model's folder are uploaded")
    if not os.path.exists(path):
        raise ValueError(f"EXTERNAL_DATA_MISSING: external data file '{location}' not found next to the model")
    root = os.path.realpath(folder)
    resolved = os.path.realpath(path)
    if os.path.commonpath([root, resolved]) != root or not os.path.isfile(resolved):
        refuse("is not a regular file inside the model's folder")
    return path


def tensor_name(tensor: bytes) -> str:
    """A serialized TensorProto's name ("" if none); WireError if the bytes do not parse."""
    name = ""
    data = memoryview(tensor)
    for field, wire, _, value_start, end, _ in _fields(data):
        if field == _TENSOR_NAME and wire == 2:
            name = bytes(data[value_start:end]).decode("utf-8", "replace")
    return name


# numpy dtype -> TensorProto.DataType (onnx.proto); raw_data is little-endian.
_DATA_TYPES = {"float32": 1, "uint8": 2, "int8": 3, "uint16": 4, "int16": 5, "int32": 6, "int64": 7, "bool": 9,
               "float16": 10, "float64": 11, "uint32": 12, "uint64": 13, "complex64": 14, "complex128": 15}


def encode_tensor(name: str, array) -> bytes:
    """A numpy array as a serialized TensorProto named `name` (dims, data_type, raw_data)."""
    import numpy  # only callers that pass arrays need it

    array = numpy.asarray(array)
    data_type = _DATA_TYPES.get(array.dtype.name)
    if data_type is None:
        raise ValueError(f"INPUTS_INVALID: input '{name}' has dtype {array.dtype}, which has no raw ONNX encoding")
    raw = numpy.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()
    out = bytearray()
    for dim in array.shape:  # repeated int64 dims = 1 (unpacked, as proto2 writes it)
        out += _encode_varint(1 << 3) + _encode_varint(dim)
    out += _encode_varint(2 << 3) + _encode_varint(data_type)
    out += _field_bytes(_TENSOR_NAME, name.encode())
    out += _field_bytes(9, raw)  # raw_data
    return bytes(out)
