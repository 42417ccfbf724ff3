// The one place passes and presets are named. Built once, immutable afterwards: no global mutable
// pass singletons, no registration by static initializers.
#ifndef ONNXOPT_OPTIMIZER_PASS_REGISTRY_H_
#define ONNXOPT_OPTIMIZER_PASS_REGISTRY_H_

#include <map>
#include <set>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "optimizer/pass.h"

namespace onnxopt {

// A named pipeline: groups run in order; a fixed-point group repeats until a sweep changes nothing.
struct PresetGroup {
  std::vector<std::string> passes;
  bool fixed_point = true;
};

struct Preset {
  std::string name;
  std::string description;
  std::vector<PresetGroup> groups;
  std::vector<std::string> AllPasses() const;
};

class PassRegistry {
 public:
  // Registers `pass` under its name: ALREADY_EXISTS if a pass has that name.
  absl::Status Register(std::unique_ptr<Pass> pass);
  // ALREADY_EXISTS if a preset has its name; NOT_FOUND if it names a pass not registered.
  absl::Status AddPreset(Preset preset);
  const Pass* FindPass(const std::string& name) const;
  const Preset* FindPreset(const std::string& name) const;
  std::vector<const Pass*> passes() const;  // by name
  std::vector<const Preset*> presets() const;

 private:
  std::map<std::string, std::unique_ptr<Pass>> passes_;
  std::map<std::string, Preset> presets_;
};

// Every pass and preset onnxopt ships.
const PassRegistry& DefaultPassRegistry();

// The default preset, used when a config names none: the best pipeline for what the model is
// (BuildPipeline resolves it).
inline constexpr char kAutoPreset[] = "auto";
// Passes `auto` leaves out because they change what a caller can feed the model.
inline const std::set<std::string> kInterfaceChangingPasses = {"eliminate_initializer_inputs"};

}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_PASS_REGISTRY_H_
