#include "server/flag_spelling.h"

#include <algorithm>
#include <map>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace onnxopt::server {

SpelledArguments ToAbseilSpelling(const std::vector<std::string>& arguments) {
  SpelledArguments spelled;
  bool flags_ended = false;
  for (const std::string& argument : arguments) {
    if (flags_ended || argument == "--" || !absl::StartsWith(argument, "-") || argument == "-") {
      flags_ended = flags_ended || argument == "--";
      spelled.arguments.push_back(argument);
      continue;
    }
    const size_t dashes = absl::StartsWith(argument, "--") ? 2 : 1;
    const size_t equals = argument.find('=');
    const std::string name = argument.substr(dashes, equals == std::string::npos ? std::string::npos : equals - dashes);
    if (name.find('_') != std::string::npos) {
      spelled.notes.push_back(absl::StrCat("--", name, " is deprecated: spell it --", absl::StrReplaceAll(name, {{"_", "-"}})));
    }
    std::string rewritten = absl::StrCat(argument.substr(0, dashes), absl::StrReplaceAll(name, {{"-", "_"}}));
    if (equals != std::string::npos) rewritten += argument.substr(equals);
    spelled.arguments.push_back(std::move(rewritten));
  }
  return spelled;
}

std::string DashedFlagsHelp(const std::string& usage, const std::string& defined_in) {
  std::map<std::string, const absl::CommandLineFlag*> ours;  // sorted by name
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (absl::EndsWith(flag->Filename(), defined_in)) ours[absl::StrReplaceAll(name, {{"_", "-"}})] = flag;
  }
  std::string help = absl::StrCat(usage, "\n\nFlags (--name=value; the --name_with_underscores spelling is deprecated):\n");
  for (const auto& [name, flag] : ours) {
    absl::StrAppend(&help, "  --", name, " (default \"", flag->DefaultValue(), "\")\n      ", flag->Help(), "\n");
  }
  return help;
}

}  // namespace onnxopt::server
