// The optimizer's precompiled headers (optimizer/precompiled.h) and gRPC with the service's stubs: what the
// server, the clients and their tests parse in every source, precompiled once per build
// (CMakeLists.txt: onnxopt_add_precompiled_headers). gRPC's headers and the stubs alone are ~200,000 lines.
#ifndef ONNXOPT_SERVER_PRECOMPILED_H_
#define ONNXOPT_SERVER_PRECOMPILED_H_

#include "grpcpp/grpcpp.h"
#include "onnxopt/v1/service.grpc.pb.h"
#include "optimizer/precompiled.h"

#endif  // ONNXOPT_SERVER_PRECOMPILED_H_
