// What ONNX Runtime reads and the onnx checker refuses, made canonical when a model is loaded
// (design.md: "What ONNX Runtime runs, onnxopt takes"). Models written by other tools (tf2onnx,
// paddle2onnx, Megatron's exporters, ONNX Runtime's own transformers optimizer, hand-written graphs)
// come in with these, and ONNX Runtime runs them:
//   - nodes out of topological order (ONNX Runtime sorts them itself): sorted, keeping the written
//     order wherever the data flow allows, in every graph and subgraph;
//   - the default domain spelled "ai.onnx" (ONNX Runtime reads it as ""): spelled "";
//   - value_info entries without a type (ONNX Runtime ignores them): dropped;
//   - ONNX Runtime's own domains (com.microsoft, com.microsoft.nchwc) used without an opset import
//     (ONNX Runtime imports them itself): imported at version 1.
// The default-domain operators that only ONNX Runtime defines below opset 17 (LayerNormalization,
// SimplifiedLayerNormalization, as its transformers optimizer writes them) need no rewrite: their
// schemas are registered beside the contrib ones (contrib_schemas.h), as ONNX Runtime registers them.
//
// A graph whose nodes form a cycle is left as written: no order runs it, and the checker says so.
#ifndef ONNXOPT_OPTIMIZER_LOAD_NORMALIZATION_H_
#define ONNXOPT_OPTIMIZER_LOAD_NORMALIZATION_H_

#include <string>
#include <vector>

#include "onnx/onnx_pb.h"

namespace onnxopt {

// Normalizes `model` in place; returns one line per kind of change made (for the report), none for a
// model that needed none. Only the graph's bookkeeping changes, never what it computes.
std::vector<std::string> NormalizeAsOnnxRuntimeReads(onnx::ModelProto* model);

// Sorts `graph`'s nodes topologically (subgraphs first, each on its own), stable: a node moves only
// when a value it reads is produced later. Names no node of the graph produces are taken as given (its
// inputs, initializers and the scopes around it). Returns the number of graphs reordered; a graph with a
// cycle is left as it was.
int SortNodesTopologically(onnx::GraphProto* graph);

}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_LOAD_NORMALIZATION_H_
