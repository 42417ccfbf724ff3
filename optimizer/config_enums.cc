#include "optimizer/config_enums.h"

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/unknown_field_set.h"
#include "google/protobuf/util/json_util.h"

namespace onnxopt {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::EnumDescriptor;
using google::protobuf::FieldDescriptor;

absl::Status UnknownName(const EnumDescriptor* type, absl::string_view what, absl::string_view name) {
  return absl::InvalidArgumentError(
      absl::StrCat("unknown ", what, " '", name, "' (known: ", absl::StrJoin(EnumNames(type), ", "), ")"));
}

bool IsWellKnownType(const Descriptor* type) { return absl::StartsWith(type->file()->name(), "google/protobuf/"); }

// The field a JSON key names: its JSON name ("lmHead") or its proto name ("lm_head"), as the parser accepts both.
const FieldDescriptor* FieldNamed(const Descriptor* type, const std::string& key) {
  for (int i = 0; i < type->field_count(); ++i) {
    if (type->field(i)->json_name() == key) return type->field(i);
  }
  return type->FindFieldByName(key);
}

absl::Status CheckObject(const google::protobuf::Struct& object, const Descriptor* type, const std::string& path);

// One JSON value standing for one element of `field` (the field itself, an entry of a list or a map's value).
absl::Status CheckElement(const google::protobuf::Value& value, const FieldDescriptor* field, const std::string& where) {
  const EnumDescriptor* enum_type = field->enum_type();
  if (enum_type != nullptr && value.kind_case() == google::protobuf::Value::kStringValue &&
      enum_type->FindValueByName(value.string_value()) == nullptr) {
    return UnknownName(enum_type, where, value.string_value());
  }
  const Descriptor* message_type = field->message_type();
  if (message_type != nullptr && value.has_struct_value() && !IsWellKnownType(message_type)) {
    return CheckObject(value.struct_value(), message_type, where);
  }
  return absl::OkStatus();
}

absl::Status CheckObject(const google::protobuf::Struct& object, const Descriptor* type, const std::string& path) {
  for (const auto& [key, value] : object.fields()) {
    const FieldDescriptor* field = FieldNamed(type, key);
    if (field == nullptr) continue;  // the parser names unknown fields
    const std::string where = path.empty() ? field->name() : absl::StrCat(path, ".", field->name());
    if (field->is_map()) {
      if (!value.has_struct_value()) continue;
      for (const auto& [entry_key, entry] : value.struct_value().fields()) {
        absl::Status status = CheckElement(entry, field->message_type()->map_value(), where);
        if (!status.ok()) return status;
      }
      continue;
    }
    if (field->is_repeated() && value.has_list_value()) {
      for (const google::protobuf::Value& entry : value.list_value().values()) {
        if (absl::Status status = CheckElement(entry, field, where); !status.ok()) return status;
      }
      continue;
    }
    if (absl::Status status = CheckElement(value, field, where); !status.ok()) return status;
  }
  return absl::OkStatus();
}

// One field that was a string under `old_number` and is the enum field `name` now.
struct LegacyField {
  int old_number;
  const char* name;
};

absl::Status UpgradeFields(google::protobuf::Message& message, std::initializer_list<LegacyField> fields,
                           absl::string_view path) {
  google::protobuf::UnknownFieldSet* unknown = message.GetReflection()->MutableUnknownFields(&message);
  for (const LegacyField& legacy : fields) {
    const FieldDescriptor* field = message.GetDescriptor()->FindFieldByName(legacy.name);
    std::string name;
    bool found = false;
    for (int i = unknown->field_count() - 1; i >= 0; --i) {
      const google::protobuf::UnknownField& entry = unknown->field(i);
      if (entry.number() != legacy.old_number || entry.type() != google::protobuf::UnknownField::TYPE_LENGTH_DELIMITED) {
        continue;
      }
      if (!found) name = entry.length_delimited();  // the last occurrence wins, as when it was a field
      found = true;
      unknown->DeleteSubrange(i, 1);
    }
    if (name.empty()) continue;  // absent, or the old default
    const google::protobuf::EnumValueDescriptor* value = field->enum_type()->FindValueByName(name);
    if (value == nullptr) return UnknownName(field->enum_type(), absl::StrCat(path, legacy.name), name);
    message.GetReflection()->SetEnumValue(&message, field, value->number());
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<std::string> EnumNames(const EnumDescriptor* type) {
  std::vector<std::string> names;
  for (int i = 0; i < type->value_count(); ++i) names.push_back(type->value(i)->name());
  return names;
}

absl::Status CheckEnumValue(const EnumDescriptor* type, int value, absl::string_view what) {
  if (type->FindValueByNumber(value) != nullptr) return absl::OkStatus();
  return UnknownName(type, what, absl::StrCat(value));
}

absl::Status CheckEnumNamesInJson(absl::string_view json, const Descriptor* type) {
  google::protobuf::Value document;
  if (!google::protobuf::util::JsonStringToMessage(std::string(json), &document).ok() || !document.has_struct_value()) {
    return absl::OkStatus();
  }
  return CheckObject(document.struct_value(), type, "");
}

absl::Status UpgradeLegacyConfig(v1::OptimizationConfig& config) {
  if (absl::Status status = UpgradeFields(config, {{1, "preset"}}, ""); !status.ok()) return status;
  if (!config.has_precision()) return absl::OkStatus();
  v1::PrecisionConfig& precision = *config.mutable_precision();
  if (absl::Status status = UpgradeFields(precision, {{1, "mode"}}, "precision."); !status.ok()) return status;
  if (precision.has_calibration()) {
    absl::Status status = UpgradeFields(*precision.mutable_calibration(), {{1, "method"}}, "precision.calibration.");
    if (!status.ok()) return status;
  }
  if (!precision.has_int4()) return absl::OkStatus();
  return UpgradeFields(*precision.mutable_int4(), {{4, "method"}, {5, "lm_head"}, {6, "embeddings"}}, "precision.int4.");
}

}  // namespace onnxopt
