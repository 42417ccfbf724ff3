#include "optimizer/config_enums.h"

#include <set>
#include <string>

#include "absl/strings/match.h"
#include "google/protobuf/unknown_field_set.h"
#include "gtest/gtest.h"
#include "optimizer/pass_registry.h"

namespace onnxopt {
namespace {

absl::Status CheckJson(const std::string& json) {
  return CheckEnumNamesInJson(json, v1::OptimizationConfig::descriptor());
}

TEST(ConfigEnumsTest, NamesComeInDeclarationOrderWithTheDefaultFirst) {
  EXPECT_EQ(EnumNames(v1::PrecisionConfig::Mode_descriptor()),
            (std::vector<std::string>{"fp32", "fp16", "bf16", "int8_dynamic", "int8_static", "int4_weight_only", "auto"}));
  EXPECT_EQ(EnumNames(v1::Pipelines::Preset_descriptor()).front(), "auto");
}

// A config names a preset from the enum; the registry builds it by that name. Neither may have one the other lacks.
TEST(ConfigEnumsTest, EveryPresetNameHasARegisteredPresetAndBackAgain) {
  std::set<std::string> registered;
  for (const Preset* preset : DefaultPassRegistry().presets()) registered.insert(preset->name);
  const std::vector<std::string> names = EnumNames(v1::Pipelines::Preset_descriptor());
  EXPECT_EQ(registered, std::set<std::string>(names.begin(), names.end()));
}

TEST(ConfigEnumsTest, AnUnknownNameInJsonNamesItsFieldAndTheChoices) {
  absl::Status preset = CheckJson(R"({"preset": "fastest"})");
  EXPECT_EQ(preset.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(preset.message(), "unknown preset 'fastest' (known: auto, basic, extended, transformer, none)");

  absl::Status nested = CheckJson(R"({"precision": {"mode": "int4_weight_only", "int4": {"lmHead": "int2"}}})");
  EXPECT_EQ(nested.message(), "unknown precision.int4.lm_head 'int2' (known: int4, int8, float)");
  EXPECT_TRUE(absl::StrContains(CheckJson(R"({"precision": {"mode": "fp8"}})").message(), "precision.mode 'fp8'"));
  EXPECT_TRUE(absl::StrContains(CheckJson(R"({"benchmark": {"device": "TPU"}})").message(),
                                "benchmark.device 'TPU' (known: DEVICE_UNSPECIFIED, DEVICE_CPU, DEVICE_CUDA)"));
}

TEST(ConfigEnumsTest, KnownNamesNumbersAndOtherStringsPass) {
  EXPECT_TRUE(CheckJson(R"({"preset": "none", "precision": {"mode": "auto", "calibration": {"method": "entropy"},
                            "int4": {"method": "hqq", "lm_head": "float", "embeddings": "int8"}}})")
                  .ok());
  EXPECT_TRUE(CheckJson(R"({"precision": {"mode": 1}})").ok()) << "a number is the parser's to judge";
  // Strings where no enum is: pass names, their params (google.protobuf.Value), dims, tolerances' keys.
  EXPECT_TRUE(CheckJson(R"({"passes": [{"name": "fp32", "params": {"to": "fp8"}}],
                            "validation": {"dimValues": {"auto": 1}, "outputTolerances": {"x": {"atol": 1}}},
                            "transformer": {"family": "bert"}})")
                  .ok());
  EXPECT_TRUE(CheckJson("not json").ok()) << "the parser reports malformed JSON";
  EXPECT_TRUE(CheckJson(R"({"unknownField": "x"})").ok()) << "the parser reports unknown fields";
}

TEST(ConfigEnumsTest, AnEnumValueOutsideTheSetIsRefusedByName) {
  EXPECT_TRUE(CheckEnumValue(v1::PrecisionConfig::Mode_descriptor(), v1::PrecisionConfig::bf16, "precision.mode").ok());
  absl::Status status = CheckEnumValue(v1::PrecisionConfig::Mode_descriptor(), 42, "precision.mode");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(status.message(), "unknown precision.mode '42' (known: fp32,")) << status;
}

// The bytes a client sends that was built while these fields were strings: each name under its old number.
std::string LegacyConfigBytes(const std::string& preset, const std::string& mode, const std::string& lm_head) {
  v1::OptimizationConfig config;
  config.set_priority(3);
  auto legacy = [](google::protobuf::Message& message, int number, const std::string& name) {
    message.GetReflection()->MutableUnknownFields(&message)->AddLengthDelimited(number, name);
  };
  legacy(config, 1, preset);
  legacy(*config.mutable_precision(), 1, mode);
  legacy(*config.mutable_precision()->mutable_calibration(), 1, "percentile");
  v1::Int4Config* int4 = config.mutable_precision()->mutable_int4();
  legacy(*int4, 4, "hqq");
  legacy(*int4, 5, lm_head);
  return config.SerializeAsString();
}

TEST(ConfigEnumsTest, ALegacyClientsStringsBecomeTheEnums) {
  v1::OptimizationConfig config;
  ASSERT_TRUE(config.ParseFromString(LegacyConfigBytes("transformer", "int4_weight_only", "int8")));
  EXPECT_FALSE(config.has_preset()) << "parsed by a current server, the names are unknown fields";
  ASSERT_TRUE(UpgradeLegacyConfig(config).ok());
  EXPECT_EQ(config.preset(), v1::Pipelines::transformer);
  EXPECT_TRUE(config.has_preset());
  EXPECT_EQ(config.precision().mode(), v1::PrecisionConfig::int4_weight_only);
  EXPECT_EQ(config.precision().calibration().method(), v1::CalibrationConfig::percentile);
  EXPECT_EQ(config.precision().int4().method(), v1::Int4Config::hqq);
  EXPECT_EQ(config.precision().int4().lm_head(), v1::Int4Config::int8);
  EXPECT_FALSE(config.precision().int4().has_embeddings()) << "not sent: stays at its default";
  EXPECT_EQ(config.priority(), 3);
  EXPECT_TRUE(config.GetReflection()->GetUnknownFields(config).empty());
  EXPECT_TRUE(config.precision().int4().GetReflection()->GetUnknownFields(config.precision().int4()).empty());

  v1::OptimizationConfig current = config;
  ASSERT_TRUE(UpgradeLegacyConfig(current).ok());
  EXPECT_EQ(current.SerializeAsString(), config.SerializeAsString()) << "a current config is left as it is";
}

TEST(ConfigEnumsTest, ALegacyNameTheEnumLacksIsRefused) {
  v1::OptimizationConfig config;
  ASSERT_TRUE(config.ParseFromString(LegacyConfigBytes("transformer", "fp8", "int8")));
  absl::Status status = UpgradeLegacyConfig(config);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(status.message(), "unknown precision.mode 'fp8' (known: fp32,")) << status;
}

TEST(ConfigEnumsTest, ALegacyEmptyNameMeantTheDefault) {
  v1::OptimizationConfig config;
  ASSERT_TRUE(config.ParseFromString(LegacyConfigBytes("", "", "float")));
  ASSERT_TRUE(UpgradeLegacyConfig(config).ok());
  EXPECT_FALSE(config.has_preset());
  EXPECT_EQ(config.precision().mode(), v1::PrecisionConfig::fp32);
  EXPECT_EQ(config.precision().int4().lm_head(), v1::Int4Config::float_);
}

}  // namespace
}  // namespace onnxopt
