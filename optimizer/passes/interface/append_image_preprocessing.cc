// append_image_preprocessing: the model takes uint8 images and does the preprocessing its image
// processor did (Olive's AppendPrePostProcessingOps), with ONNX's standard operators only.
//
// Before:  pixel_values float[N, 3, H, W]  (normalized by the caller)
// After:   image uint8[N, height, width, 3] (layout NHWC; HWC: one image [height, width, 3])
//          x = Resize(image, sizes, axes=[1, 2], antialias)   exactly to a size, or the shortest edge to
//                                                            a size (long edge int(size * long / short))
//          x = Slice(x) to H x W at top = (h - H) / 2, left = (w - W) / 2    (center crop)
//          pixel_values = Transpose((Cast(x) * rescale - mean) / std, [0, 3, 1, 2])
//
// As Hugging Face's processors compute it: PIL resizes uint8 images in two passes with rounding
// between, which is what ONNX Runtime's Resize does for uint8 input with antialias (so the resize runs
// on the uint8 image, half-pixel centers, cubic a = -0.5 as PIL's bicubic, the filter renormalized over
// the taps inside the image), and normalizes in float32 in this order. Measured against PIL 9.4 on odd
// sizes up and down: at most one gray level apart on under 0.5% of the values (the two round a few
// fixed-point sums the other way). Families give the defaults (their processors' configs at a 224 crop, scaled to the
// model's H x W); explicit parameters override them. Resize's antialias and axes need opset 18: an older
// model (13..17) is moved to 18, its Reduce* axes attributes becoming inputs (the only operators whose
// form changed). With neither a family nor the steps given, the family the job's report detects in the
// model (vit, deit, dinov2; a ViT with QuickGELU is CLIP's vision tower) gives them, and the pass's
// note says so; a model no family is detected in needs them given.
#include <cmath>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "optimizer/passes/constants.h"
#include "optimizer/passes/passes.h"
#include "optimizer/passes/rewrite.h"
#include "optimizer/transformer_report.h"

namespace onnxopt {
namespace {

struct Preprocessing {
  std::string resize = "none";  // "exact", "shortest_edge" or "none"
  int64_t height = 0, width = 0, shortest_edge = 0;
  std::string resample = "linear";
  bool crop = false;
  double rescale = 1.0 / 255;
  std::vector<float> mean = {0, 0, 0}, std = {1, 1, 1};
};

// The image family the model's structure tells (the transformer report's detection), or "".
std::string DetectedImageFamily(const onnx::ModelProto& model) {
  const std::string family = DetectTransformer(model).family;
  if (family == "vit" && ReadTransformerEvidence(model).sigmoid_gelu) return "clip";  // CLIP's vision tower
  return family == "vit" || family == "deit" || family == "dinov2" ? family : "";
}

// Hugging Face's processors at a 224 crop, scaled to the model's input size.
std::optional<Preprocessing> FamilyDefaults(const std::string& family, int64_t height, int64_t width) {
  const std::vector<float> imagenet_mean = {0.485f, 0.456f, 0.406f}, imagenet_std = {0.229f, 0.224f, 0.225f};
  auto scaled = [](int64_t size) { return static_cast<int64_t>(std::lround(size * 256.0 / 224.0)); };
  Preprocessing p;
  if (family == "vit") {
    p.resize = "exact";
    p.height = height;
    p.width = width;
    p.mean = {0.5f, 0.5f, 0.5f};
    p.std = {0.5f, 0.5f, 0.5f};
  } else if (family == "deit") {
    p = Preprocessing{"exact", scaled(height), scaled(width), 0, "cubic", true, 1.0 / 255, imagenet_mean, imagenet_std};
  } else if (family == "dinov2") {
    p = Preprocessing{"shortest_edge", 0,           0, scaled(std::min(height, width)), "cubic", true, 1.0 / 255,
                      imagenet_mean,   imagenet_std};
  } else if (family == "clip") {
    p = Preprocessing{"shortest_edge",
                      0,
                      0,
                      std::min(height, width),
                      "cubic",
                      true,
                      1.0 / 255,
                      {0.48145466f, 0.4578275f, 0.40821073f},
                      {0.26862954f, 0.26130258f, 0.27577711f}};
  } else {
    return std::nullopt;
  }
  return p;
}

absl::StatusOr<std::vector<float>> ParseTriple(const std::string& text, const char* what) {
  std::vector<float> values;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    float value = 0;
    if (!absl::SimpleAtof(absl::StripAsciiWhitespace(part), &value)) break;
    values.push_back(value);
  }
  if (values.size() != 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("append_image_preprocessing: ", what, " '", text, "' is not three comma-separated numbers"));
  }
  return values;
}

// The model's image input: the named one, or its only float input of rank 4.
const onnx::ValueInfoProto* ImageInput(const onnx::GraphProto& graph, const std::string& name) {
  const onnx::ValueInfoProto* found = nullptr;
  for (const auto& input : graph.input()) {
    const auto& type = input.type().tensor_type();
    const bool image_like = type.shape().dim_size() == 4 && (type.elem_type() == onnx::TensorProto::FLOAT ||
                                                             type.elem_type() == onnx::TensorProto::FLOAT16);
    if (!name.empty() ? input.name() == name : image_like) {
      if (found != nullptr && name.empty()) return nullptr;  // more than one: the caller names it
      found = &input;
    }
  }
  return found;
}

// Opset 13..17 -> 18, the operators whose form changed: Reduce* but ReduceSum take their axes as an
// input, and a Split into equal parts says how many (num_outputs).
void MoveToOpset18(onnx::GraphProto* graph, int* counter) {
  for (auto& node : *graph->mutable_node()) {
    for (auto& attribute : *node.mutable_attribute()) {
      if (attribute.has_g()) MoveToOpset18(attribute.mutable_g(), counter);
      for (auto& body : *attribute.mutable_graphs()) MoveToOpset18(&body, counter);
    }
    if (!node.domain().empty() && node.domain() != "ai.onnx") continue;
    if (node.op_type() == "Split" && (node.input_size() < 2 || node.input(1).empty())) {
      *node.add_attribute() = MakeIntAttribute("num_outputs", node.output_size());
      continue;
    }
    if (!absl::StartsWith(node.op_type(), "Reduce") || node.op_type() == "ReduceSum") continue;
    for (int i = 0; i < node.attribute_size(); ++i) {
      if (node.attribute(i).name() != "axes") continue;
      const std::string name = absl::StrCat("preprocess/opset18_axes_", (*counter)++);
      *graph->add_initializer() =
          MakeInt64Tensor(name, std::vector<int64_t>(node.attribute(i).ints().begin(), node.attribute(i).ints().end()));
      node.mutable_attribute()->DeleteSubrange(i, 1);
      node.add_input(name);
      break;
    }
  }
}

class AppendImagePreprocessingPass final : public Pass {
 public:
  absl::string_view name() const override { return "append_image_preprocessing"; }
  absl::string_view description() const override {
    return "The model takes uint8 images (NHWC or HWC) and resizes, center-crops, rescales, normalizes and "
           "transposes them itself, as its image processor did (changes the interface; opset 18)";
  }
  std::vector<ParamSpec> params() const override {
    return {{"family", ParamType::kString, "",
             "vit, deit, dinov2 or clip: their processors' defaults (default: the family detected in the model)"},
            {"input", ParamType::kString, "", "the model's image input (default: its only float input of rank 4)"},
            {"image_input", ParamType::kString, "image", "the name of the uint8 input it gets"},
            {"layout", ParamType::kString, "NHWC", "NHWC (a batch of images) or HWC (one image)"},
            {"resize", ParamType::kString, "", "exact, shortest_edge or none (default: the family's)"},
            {"resize_height", ParamType::kInt, "0", "exact resize: the height (0: the family's)"},
            {"resize_width", ParamType::kInt, "0", "exact resize: the width (0: the family's)"},
            {"shortest_edge", ParamType::kInt, "0", "shortest_edge resize: its size (0: the family's)"},
            {"resample", ParamType::kString, "", "linear, cubic or nearest (default: the family's)"},
            {"antialias", ParamType::kBool, "true", "filter when downscaling, as PIL does"},
            {"center_crop", ParamType::kString, "", "true or false: crop to the model's H x W (default: the family's)"},
            {"rescale", ParamType::kDouble, "0", "the factor on uint8 values (0: the family's, 1/255)"},
            {"mean", ParamType::kString, "", "per channel, e.g. 0.485,0.456,0.406 (default: the family's)"},
            {"std", ParamType::kString, "", "per channel (default: the family's)"}};
  }
  absl::Status ValidateParams(const PassParams& params) const override {
    const std::string& family = params.GetString("family");
    if (!family.empty() && !FamilyDefaults(family, 224, 224)) {
      return absl::InvalidArgumentError(
          absl::StrCat("append_image_preprocessing: family '", family, "' is unknown (vit, deit, dinov2, clip)"));
    }
    auto one_of = [&](const char* param, std::initializer_list<const char*> allowed) -> absl::Status {
      const std::string& value = params.GetString(param);
      if (value.empty()) return absl::OkStatus();
      for (const char* option : allowed) {
        if (value == option) return absl::OkStatus();
      }
      return absl::InvalidArgumentError(absl::StrCat("append_image_preprocessing: ", param, " '", value,
                                                     "' is not one of ", absl::StrJoin(allowed, ", ")));
    };
    for (absl::Status status :
         {one_of("layout", {"NHWC", "HWC"}), one_of("resize", {"exact", "shortest_edge", "none"}),
          one_of("resample", {"linear", "cubic", "nearest"}), one_of("center_crop", {"true", "false"})}) {
      if (!status.ok()) return status;
    }
    return absl::OkStatus();
  }
  bool is_model_pass() const override { return true; }
  ShapeEffect shape_effect() const override { return ShapeEffect::kInvalidatesAlways; }
  absl::Status RunOnGraph(Graph&, PassContext&) const override { return absl::OkStatus(); }

  absl::Status RunOnModel(onnx::ModelProto* model, PassContext& context) const override {
    const PassParams& params = context.params();
    const onnx::ValueInfoProto* input = ImageInput(model->graph(), params.GetString("input"));
    if (input == nullptr) {
      return absl::InvalidArgumentError(
          params.GetString("input").empty()
              ? "append_image_preprocessing: the model has no single float input of rank 4; name it with `input`"
              : absl::StrCat("append_image_preprocessing: no input '", params.GetString("input"), "'"));
    }
    const auto& shape = input->type().tensor_type().shape();
    if (shape.dim_size() != 4 || !shape.dim(1).has_dim_value() || shape.dim(1).dim_value() != 3 ||
        !shape.dim(2).has_dim_value() || !shape.dim(3).has_dim_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("append_image_preprocessing: '", input->name(), "' is not [N, 3, H, W] with a static H and W"));
    }
    const int64_t opset = context.OpsetVersion("");
    if (opset < 13) {
      return absl::InvalidArgumentError(absl::StrCat("append_image_preprocessing: opset ", opset,
                                                     " is older than 13; convert_opset the model first"));
    }
    std::string family = params.GetString("family");
    if (family.empty() && params.GetString("resize").empty() && params.GetString("mean").empty()) {
      family = DetectedImageFamily(*model);
      if (family.empty()) {
        return absl::InvalidArgumentError(
            "append_image_preprocessing: no image family (vit, deit, dinov2, clip) is detected in the model; give a "
            "family or the steps (resize, mean, std...)");
      }
      context.Note(absl::StrCat("no family given: the model's detected family '", family, "' gives the steps"));
    }
    absl::StatusOr<Preprocessing> steps = Resolve(params, family, shape.dim(2).dim_value(), shape.dim(3).dim_value());
    if (!steps.ok()) return steps.status();
    if (opset < 18) {
      int counter = 0;
      MoveToOpset18(model->mutable_graph(), &counter);
      for (auto& import : *model->mutable_opset_import()) {
        if (import.domain().empty() || import.domain() == "ai.onnx") import.set_version(18);
      }
      model->set_ir_version(std::max<int64_t>(model->ir_version(), 8));  // what opset 18 needs
      context.Count("opset_raised_to_18");
    }
    Append(model->mutable_graph(), *input, *steps, params, shape.dim(2).dim_value(), shape.dim(3).dim_value());
    context.CountRewrite();
    context.Note(absl::StrCat("resize ", steps->resize, " (", steps->resample,
                              params.GetBool("antialias") ? ", antialias" : "", ")", steps->crop ? ", center crop" : "",
                              ", rescale ", steps->rescale, ", mean ", absl::StrJoin(steps->mean, "/"), ", std ",
                              absl::StrJoin(steps->std, "/")));
    return absl::OkStatus();
  }

 private:
  // The steps: `family`'s defaults (none: the pass's), overridden by the explicit parameters.
  static absl::StatusOr<Preprocessing> Resolve(const PassParams& params, const std::string& family, int64_t height,
                                               int64_t width) {
    Preprocessing p;
    if (!family.empty()) p = *FamilyDefaults(family, height, width);
    if (!params.GetString("resize").empty()) p.resize = params.GetString("resize");
    if (params.GetInt("resize_height") > 0) p.height = params.GetInt("resize_height");
    if (params.GetInt("resize_width") > 0) p.width = params.GetInt("resize_width");
    if (params.GetInt("shortest_edge") > 0) p.shortest_edge = params.GetInt("shortest_edge");
    if (!params.GetString("resample").empty()) p.resample = params.GetString("resample");
    if (!params.GetString("center_crop").empty()) p.crop = params.GetString("center_crop") == "true";
    if (params.GetDouble("rescale") > 0) p.rescale = params.GetDouble("rescale");
    for (auto [param, into] : {std::pair{"mean", &p.mean}, std::pair{"std", &p.std}}) {
      if (params.GetString(param).empty()) continue;
      absl::StatusOr<std::vector<float>> values = ParseTriple(params.GetString(param), param);
      if (!values.ok()) return values.status();
      *into = *values;
    }
    if (p.resize == "exact" && (p.height <= 0 || p.width <= 0)) {
      return absl::InvalidArgumentError(
          "append_image_preprocessing: an exact resize needs resize_height and resize_width");
    }
    if (p.resize == "shortest_edge" && p.shortest_edge <= 0) {
      return absl::InvalidArgumentError("append_image_preprocessing: a shortest_edge resize needs shortest_edge");
    }
    if (!p.crop && (p.resize == "shortest_edge" || (p.resize == "exact" && (p.height != height || p.width != width)))) {
      return absl::InvalidArgumentError(
          absl::StrCat("append_image_preprocessing: without a center crop the resize must "
                       "give the model's ",
                       height, " x ", width));
    }
    const int64_t smallest = p.resize == "exact" ? std::min(p.height, p.width) : p.shortest_edge;
    if (p.crop && p.resize != "none" &&
        (p.resize == "exact" ? (p.height < height || p.width < width) : smallest < std::max(height, width))) {
      return absl::InvalidArgumentError(
          absl::StrCat("append_image_preprocessing: the resized image would be smaller than "
                       "the ",
                       height, " x ", width, " crop"));
    }
    for (float value : p.std) {
      if (value == 0) return absl::InvalidArgumentError("append_image_preprocessing: a std of 0");
    }
    return p;
  }

  // The nodes, in front of the graph's; the image input replaces the model's.
  static void Append(onnx::GraphProto* graph, const onnx::ValueInfoProto& input, const Preprocessing& p,
                     const PassParams& params, int64_t height, int64_t width) {
    const std::string target = input.name();
    const int32_t float_type = input.type().tensor_type().elem_type();
    const std::string image = params.GetString("image_input");
    const std::string prefix = "preprocess/";
    std::vector<onnx::NodeProto> nodes;
    auto constant = [&](const std::string& name, onnx::TensorProto tensor) {
      tensor.set_name(prefix + name);
      *graph->add_initializer() = std::move(tensor);
      return prefix + name;
    };
    auto node = [&](const std::string& op, std::vector<std::string> inputs, const std::string& output) {
      nodes.push_back(MakeNode(op, prefix + output, std::move(inputs), {prefix + output}));
      return prefix + output;
    };
    auto gather = [&](const std::string& shape, int64_t axis, const std::string& name) {
      nodes.push_back(MakeNode("Gather", prefix + name,
                               {shape, constant(name + "_axis", MakeIntScalar("", onnx::TensorProto::INT64, axis))},
                               {prefix + name}));
      return prefix + name;
    };
    auto as_1d = [&](const std::string& scalar) {
      return node("Unsqueeze",
                  {scalar, constant(absl::StrCat(scalar.substr(prefix.size()), "_axes"), MakeInt64Tensor("", {0}))},
                  scalar.substr(prefix.size()) + "_1d");
    };
    std::string x = image;
    if (params.GetString("layout") == "HWC")
      x = node("Unsqueeze", {image, constant("batch_axis", MakeInt64Tensor("", {0}))}, "batched");
    if (p.resize != "none") {
      std::string sizes;
      if (p.resize == "exact") {
        sizes = constant("sizes", MakeInt64Tensor("", {p.height, p.width}));
      } else {
        // The short edge to S, the long one to S * long / short (integer division: int() of the quotient).
        const std::string shape = node("Shape", {x}, "image_shape");
        const std::string h = gather(shape, 1, "image_height"), w = gather(shape, 2, "image_width");
        const std::string edge =
            constant("shortest_edge", MakeIntScalar("", onnx::TensorProto::INT64, p.shortest_edge));
        const std::string wide = node("LessOrEqual", {h, w}, "height_is_short");
        const std::string long_h = node("Div", {node("Mul", {edge, h}, "edge_times_height"), w}, "scaled_height");
        const std::string long_w = node("Div", {node("Mul", {edge, w}, "edge_times_width"), h}, "scaled_width");
        const std::string new_h = node("Where", {wide, edge, long_h}, "resized_height");
        const std::string new_w = node("Where", {wide, long_w, edge}, "resized_width");
        onnx::NodeProto concat = MakeNode("Concat", prefix + "sizes", {as_1d(new_h), as_1d(new_w)}, {prefix + "sizes"});
        *concat.add_attribute() = MakeIntAttribute("axis", 0);
        nodes.push_back(std::move(concat));
        sizes = prefix + "sizes";
      }
      onnx::NodeProto resize = MakeNode("Resize", prefix + "resized", {x, "", "", sizes}, {prefix + "resized"});
      *resize.add_attribute() = MakeIntsAttribute("axes", {1, 2});
      *resize.add_attribute() = MakeIntAttribute("antialias", params.GetBool("antialias") ? 1 : 0);
      onnx::AttributeProto mode;
      mode.set_name("mode");
      mode.set_type(onnx::AttributeProto::STRING);
      mode.set_s(p.resample);
      *resize.add_attribute() = mode;
      onnx::AttributeProto transform = mode;
      transform.set_name("coordinate_transformation_mode");
      transform.set_s("half_pixel");  // PIL samples at pixel centers
      *resize.add_attribute() = transform;
      if (p.resample == "cubic") *resize.add_attribute() = MakeFloatAttribute("cubic_coeff_a", -0.5f);  // PIL's
      *resize.add_attribute() = MakeIntAttribute("exclude_outside", 1);  // PIL weighs the taps inside the image
      nodes.push_back(std::move(resize));
      x = prefix + "resized";
    }
    if (p.crop) {
      const std::string shape = node("Shape", {x}, "resized_shape");
      const std::string h = gather(shape, 1, "resized_height_now"), w = gather(shape, 2, "resized_width_now");
      const std::string two = constant("two", MakeIntScalar("", onnx::TensorProto::INT64, 2));
      const std::string top =
          node("Div",
               {node("Sub", {h, constant("crop_height", MakeIntScalar("", onnx::TensorProto::INT64, height))},
                     "spare_height"),
                two},
               "crop_top");
      const std::string left = node(
          "Div",
          {node("Sub", {w, constant("crop_width", MakeIntScalar("", onnx::TensorProto::INT64, width))}, "spare_width"),
           two},
          "crop_left");
      onnx::NodeProto starts =
          MakeNode("Concat", prefix + "crop_starts", {as_1d(top), as_1d(left)}, {prefix + "crop_starts"});
      *starts.add_attribute() = MakeIntAttribute("axis", 0);
      nodes.push_back(std::move(starts));
      const std::string ends = node(
          "Add", {prefix + "crop_starts", constant("crop_size", MakeInt64Tensor("", {height, width}))}, "crop_ends");
      x = node("Slice", {x, prefix + "crop_starts", ends, constant("crop_axes", MakeInt64Tensor("", {1, 2}))},
               "cropped");
    }
    onnx::NodeProto cast = MakeNode("Cast", prefix + "as_float", {x}, {prefix + "as_float"});
    *cast.add_attribute() = MakeIntAttribute("to", onnx::TensorProto::FLOAT);
    nodes.push_back(std::move(cast));
    x = node("Mul",
             {prefix + "as_float", constant("rescale", MakeFloatTensor("", {}, {static_cast<float>(p.rescale)}))},
             "rescaled");
    x = node("Sub", {x, constant("mean", MakeFloatTensor("", {3}, p.mean))}, "centered");
    x = node("Div", {x, constant("std", MakeFloatTensor("", {3}, p.std))}, "normalized");
    onnx::NodeProto transpose = MakeNode("Transpose", prefix + "nchw", {x},
                                         {float_type == onnx::TensorProto::FLOAT ? target : prefix + "nchw"});
    *transpose.add_attribute() = MakeIntsAttribute("perm", {0, 3, 1, 2});
    nodes.push_back(std::move(transpose));
    if (float_type != onnx::TensorProto::FLOAT) {
      onnx::NodeProto narrow = MakeNode("Cast", prefix + "as_model_type", {prefix + "nchw"}, {target});
      *narrow.add_attribute() = MakeIntAttribute("to", float_type);
      nodes.push_back(std::move(narrow));
    }
    // The new nodes first, then the model's.
    google::protobuf::RepeatedPtrField<onnx::NodeProto> ordered;
    for (auto& made : nodes) *ordered.Add() = std::move(made);
    for (auto& existing : *graph->mutable_node()) *ordered.Add() = std::move(existing);
    graph->mutable_node()->Swap(&ordered);
    // The image input takes the old input's place.
    for (auto& declared : *graph->mutable_input()) {
      if (declared.name() != target) continue;
      onnx::ValueInfoProto replaced;
      replaced.set_name(image);
      auto* type = replaced.mutable_type()->mutable_tensor_type();
      type->set_elem_type(onnx::TensorProto::UINT8);
      const bool batched = params.GetString("layout") == "NHWC";
      if (batched) *type->mutable_shape()->add_dim() = input.type().tensor_type().shape().dim(0);
      type->mutable_shape()->add_dim()->set_dim_param("height");
      type->mutable_shape()->add_dim()->set_dim_param("width");
      type->mutable_shape()->add_dim()->set_dim_value(3);
      replaced.set_doc_string(batched ? "uint8 RGB images [N, height, width, 3]"
                                      : "one uint8 RGB image [height, width, 3]");
      declared = std::move(replaced);
      break;
    }
  }
};

}  // namespace

std::unique_ptr<Pass> MakeAppendImagePreprocessingPass() { return std::make_unique<AppendImagePreprocessingPass>(); }

}  // namespace onnxopt
