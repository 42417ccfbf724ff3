#include "optimizer/utf8.h"

#include "absl/strings/str_format.h"

namespace onnxopt {
namespace {

using google::protobuf::FieldDescriptor;

// Length of the well-formed UTF-8 sequence at the start of `text` (RFC 3629: no overlong forms, no
// surrogates, nothing above U+10FFFF), or 0 if there is none.
size_t SequenceLength(absl::string_view text) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  const auto continuation = [&](size_t i) { return i < text.size() && (byte(i) & 0xC0) == 0x80; };
  const unsigned char lead = byte(0);
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return continuation(1) ? 2 : 0;
  if (lead >= 0xE0 && lead <= 0xEF) {
    if (!continuation(1) || !continuation(2)) return 0;
    if (lead == 0xE0 && byte(1) < 0xA0) return 0;  // overlong
    if (lead == 0xED && byte(1) > 0x9F) return 0;  // surrogate
    return 3;
  }
  if (lead >= 0xF0 && lead <= 0xF4) {
    if (!continuation(1) || !continuation(2) || !continuation(3)) return 0;
    if (lead == 0xF0 && byte(1) < 0x90) return 0;  // overlong
    if (lead == 0xF4 && byte(1) > 0x8F) return 0;  // above U+10FFFF
    return 4;
  }
  return 0;
}

bool FixString(const google::protobuf::Reflection* reflection, google::protobuf::Message* message,
               const FieldDescriptor* field, int index) {
  std::string scratch;
  const std::string& value = index < 0 ? reflection->GetStringReference(*message, field, &scratch)
                                       : reflection->GetRepeatedStringReference(*message, field, index, &scratch);
  if (IsValidUtf8(value)) return false;
  std::string fixed = ValidUtf8(value);
  if (index < 0) {
    reflection->SetString(message, field, std::move(fixed));
  } else {
    reflection->SetRepeatedString(message, field, index, std::move(fixed));
  }
  return true;
}

}  // namespace

bool IsValidUtf8(absl::string_view text) {
  for (size_t i = 0; i < text.size();) {
    const size_t length = SequenceLength(text.substr(i));
    if (length == 0) return false;
    i += length;
  }
  return true;
}

std::string ValidUtf8(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const size_t length = SequenceLength(text.substr(i));
    if (length == 0) {
      absl::StrAppendFormat(&out, "\\x%02x", static_cast<unsigned char>(text[i]));
      ++i;
    } else {
      out.append(text.data() + i, length);
      i += length;
    }
  }
  return out;
}

int MakeStringsValidUtf8(google::protobuf::Message* message) {
  const google::protobuf::Reflection* reflection = message->GetReflection();
  std::vector<const FieldDescriptor*> fields;
  reflection->ListFields(*message, &fields);  // only fields that are set; map fields as repeated entries
  int changed = 0;
  for (const FieldDescriptor* field : fields) {
    if (field->type() == FieldDescriptor::TYPE_STRING) {
      if (!field->is_repeated()) {
        changed += FixString(reflection, message, field, -1);
      } else {
        for (int i = 0; i < reflection->FieldSize(*message, field); ++i) changed += FixString(reflection, message, field, i);
      }
    } else if (field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      if (!field->is_repeated()) {
        changed += MakeStringsValidUtf8(reflection->MutableMessage(message, field));
      } else {
        for (int i = 0; i < reflection->FieldSize(*message, field); ++i) {
          changed += MakeStringsValidUtf8(reflection->MutableRepeatedMessage(message, field, i));
        }
      }
    }
  }
  return changed;
}

}  // namespace onnxopt
