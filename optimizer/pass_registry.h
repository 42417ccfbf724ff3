// The one place passes and presets are named. Built once, immutable afterwards: no global mutable
// pass singletons, no registration by static initializers.
#ifndef ONNXOPT_OPTIMIZER_PASS_REGISTRY_H_
#define ONNXOPT_OPTIMIZER_PASS_REGISTRY_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

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
  void Register(std::unique_ptr<Pass> pass);
  void AddPreset(Preset preset);
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

inline constexpr char kDefaultPreset[] = "basic";

}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_PASS_REGISTRY_H_
