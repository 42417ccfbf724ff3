// A decoder exported with a key/value cache, as its inputs and outputs show it: past tensors in
// (Optimum's `past_key_values.{i}.key|value`, or `past_*`), each fed back from the present output of
// the same name with "present" for "past_key_values" (or "past"), along one axis that grows from the
// past length P to the total T = P + S, S the new tokens of the token input [B, S], and usually a
// mask [B, T] over every position (and, in a merged decoder, `use_cache_branch`). Read from the declared types alone, so it holds for the original
// and the optimized model alike (the optimizer keeps inputs and outputs), and it tells the input
// generator, the mask probe and the generation benchmark how P, S and T relate.
#ifndef ONNXOPT_OPTIMIZER_CACHE_INTERFACE_H_
#define ONNXOPT_OPTIMIZER_CACHE_INTERFACE_H_

#include <optional>
#include <string>
#include <vector>

#include "onnx/onnx_pb.h"

namespace onnxopt {

struct CacheInterface {
  struct Entry {
    std::string past, present;
    int axis = 2;  // the growing axis
  };
  std::vector<Entry> entries;
  std::string batch_dim;  // B's name (the token input's axis 0); "" if unnamed
  std::string past_dim;   // P's name (the past inputs' growing axis)
  std::string new_dim;    // S's name (the token input's axis 1)
  std::string total_dim;  // T's name (the mask's axis 1, or the presents' growing axis); "" if unnamed
  std::string ids_input;  // [B, S] integer tokens
  std::string mask_input;  // [B, T]; "" if the model takes none
  std::string position_input;  // [B, S] position ids; "" if the model takes none
  std::string logits_output;  // [B, S, V] (or [B, V]): the first output that is no present
  // Optimum's merged decoder: a bool [1] input choosing the branch that reads the past (true) or the one
  // without it (false, the first step); "" if the model takes none. Fed P > 0.
  std::string use_cache_input;

  // The dim value of `name` given the past and new lengths, or nullopt for a dim of another role.
  std::optional<int64_t> RoleValue(const std::string& name, int64_t past, int64_t new_tokens) const;
};

// The optional input the logits_to_keep pass adds (int64 [1], default 0: every position): fed k >= 1,
// the logits cover the last k positions only. A generation loop feeds 1 wherever the model has it.
inline constexpr char kLogitsToKeepInput[] = "logits_to_keep";

// The cache interface of `graph`, or nullopt when it has none (no past input paired with a present
// output along one named axis, or no [B, S] token input).
std::optional<CacheInterface> FindCacheInterface(const onnx::GraphProto& graph);

}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_CACHE_INTERFACE_H_
