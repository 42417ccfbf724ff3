// The passes and presets of a registry as the API describes them (ListPasses): what the server
// answers and what `onnxopt passes` prints without a server, from one function.
#ifndef ONNXOPT_OPTIMIZER_PASS_CATALOG_H_
#define ONNXOPT_OPTIMIZER_PASS_CATALOG_H_

#include "onnxopt/v1/service.pb.h"
#include "optimizer/pass_registry.h"

namespace onnxopt {

v1::ListPassesResponse DescribePasses(const PassRegistry& registry);

}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_PASS_CATALOG_H_
