// Which constants of a traced export carry an input's length, found by where they flow, not by what
// they hold (make_dims_dynamic's analysis).
//
// A model traced at a static length L bakes L into constants: Reshape targets, Range limits, Slice
// ends, position-id tables, causal masks. A constant equal to L may just as well be a head size or a
// width that happens to equal L. So every constant element equal to L, and every dim equal to L of a
// constant tensor, gets a variable of its own where a node reads it; the freed input dim gets one
// too; and the shapes flow through the graph (numerically: the model is static) with each operator's
// rule saying which dims must be the same dim: the two operands of a broadcast, a MatMul's contracted
// axes, a Reshape's dims that keep their place (equal products on both sides), a Range's limit and its
// output, a Slice's end and its output... Variables that must equal the freed dim are the length; the
// others (a head size that only ever meets head sizes) keep their value.
#ifndef ONNXOPT_OPTIMIZER_PASSES_INTERFACE_LENGTH_PROVENANCE_H_
#define ONNXOPT_OPTIMIZER_PASSES_INTERFACE_LENGTH_PROVENANCE_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "optimizer/graph.h"

namespace onnxopt {

// A graph input's static dim to free.
struct FreedDim {
  std::string input;
  int64_t axis = 0;
  std::string name;    // the dim_param it becomes
  int64_t length = 0;  // the static value it had
};

// A constant as one node reads it: input `slot` of `reader`.
struct ConstantRead {
  Node* reader = nullptr;
  int slot = 0;
  bool operator<(const ConstantRead& other) const {
    return reader != other.reader ? reader < other.reader : slot < other.slot;
  }
};

struct LengthProvenance {
  // Integer constants whose elements are a freed length: element index -> which FreedDim.
  std::map<ConstantRead, std::map<int, int>> elements;
  // Constant tensors whose dims are a freed length: dim index -> which FreedDim (baked tables).
  std::map<ConstantRead, std::map<int, int>> tables;
  // Graph outputs' dims that are a freed length: output name -> dim index -> which FreedDim.
  std::map<std::string, std::map<int, int>> outputs;
  // Set when two freed dims of different names must be one dim (the graph ties them).
  std::string conflict;
};

// The analysis over the main graph; the lengths must be > 1 (a 1 is every broadcast dim). Dims whose provenance is lost
// (an operator it has no rule for) are no evidence either way: what they meet is decided by the rest of the graph.
LengthProvenance TraceLengths(const Graph& graph, const std::vector<FreedDim>& dims);

}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_PASSES_INTERFACE_LENGTH_PROVENANCE_H_
