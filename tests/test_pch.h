// The headers nearly every optimizer test includes, precompiled once for the optimizer_test target
// (tests/CMakeLists.txt): each of its sources otherwise parses about 240,000 lines of them, most of
// its compile time (one source: 17 s without, 12 s with, on this 2-core machine).
#ifndef ONNXOPT_TESTS_TEST_PCH_H_
#define ONNXOPT_TESTS_TEST_PCH_H_

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "onnx/onnx_pb.h"
#include "onnxopt/v1/config.pb.h"
#include "onnxopt/v1/report.pb.h"
#include "onnxruntime_cxx_api.h"

#endif  // ONNXOPT_TESTS_TEST_PCH_H_
