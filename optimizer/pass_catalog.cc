#include "optimizer/pass_catalog.h"

#include <string>

namespace onnxopt {

v1::ListPassesResponse DescribePasses(const PassRegistry& registry) {
  v1::ListPassesResponse response;
  for (const Pass* pass : registry.passes()) {
    v1::PassInfo* info = response.add_passes();
    info->set_name(std::string(pass->name()));
    info->set_description(std::string(pass->description()));
    for (const ParamSpec& spec : pass->params()) {
      v1::PassParam* param = info->add_params();
      param->set_name(spec.name);
      param->set_type(std::string(ParamTypeName(spec.type)));
      param->set_default_value(spec.default_value);
      param->set_description(spec.description);
    }
  }
  for (const Preset* preset : registry.presets()) {
    v1::Preset* out = response.add_presets();
    out->set_name(preset->name);
    out->set_description(preset->description);
    for (const auto& pass : preset->AllPasses()) out->add_passes(pass);
  }
  return response;
}

}  // namespace onnxopt
