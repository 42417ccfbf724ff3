#include "optimizer/pass_registry.h"

#include "optimizer/passes/passes.h"

namespace onnxopt {

void PassRegistry::Register(std::unique_ptr<Pass> pass) {
  std::string name(pass->name());
  passes_[name] = std::move(pass);
}

void PassRegistry::AddPreset(Preset preset) {
  std::string name = preset.name;
  presets_[name] = std::move(preset);
}

const Pass* PassRegistry::FindPass(const std::string& name) const {
  auto it = passes_.find(name);
  return it == passes_.end() ? nullptr : it->second.get();
}

const Preset* PassRegistry::FindPreset(const std::string& name) const {
  auto it = presets_.find(name);
  return it == presets_.end() ? nullptr : &it->second;
}

std::vector<const Pass*> PassRegistry::passes() const {
  std::vector<const Pass*> result;
  for (const auto& entry : passes_) result.push_back(entry.second.get());
  return result;
}

std::vector<const Preset*> PassRegistry::presets() const {
  std::vector<const Preset*> result;
  for (const auto& entry : presets_) result.push_back(&entry.second);
  return result;
}

const PassRegistry& DefaultPassRegistry() {
  static const PassRegistry* const registry = [] {
    auto* built = new PassRegistry();
    built->Register(MakeEliminateIdentityPass());
    built->Register(MakeEliminateDropoutPass());
    built->Register(MakeEliminateDeadNodesPass());
    built->Register(MakeEliminateUnusedInitializersPass());
    built->AddPreset({"none", "no rewrites: validate and benchmark the model as it is", {}, false});
    built->AddPreset({"basic",
                      "safe cleanups repeated until nothing changes: Identity and inference Dropout "
                      "removal, dead nodes, unused initializers",
                      {"eliminate_identity", "eliminate_dropout", "eliminate_dead_nodes",
                       "eliminate_unused_initializers"},
                      true});
    return built;
  }();
  return *registry;
}

}  // namespace onnxopt
