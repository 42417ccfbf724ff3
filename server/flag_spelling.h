// One spelling for the flags the server and the CLI share: dashes (`--tls-cert`, `--data-dir`), as the
// CLI and most tools write them. abseil names flags with underscores, so the server translates the
// command line before abseil parses it; the underscore spelling still works, with a deprecation note.
#ifndef ONNXOPT_SERVER_FLAG_SPELLING_H_
#define ONNXOPT_SERVER_FLAG_SPELLING_H_

#include <string>
#include <vector>

namespace onnxopt::server {

struct SpelledArguments {
  std::vector<std::string> arguments;  // as abseil reads them: flag names with underscores
  std::vector<std::string> notes;      // one per flag given in the deprecated underscore spelling
};

// Rewrites `--name-with-dashes[=v]` to `--name_with_dashes[=v]`; values, positional arguments and
// everything after `--` stay as they are.
SpelledArguments ToAbseilSpelling(const std::vector<std::string>& arguments);

// --help in the dashed spelling: the flags defined in files whose path ends with `defined_in`, with
// their defaults and help.
std::string DashedFlagsHelp(const std::string& usage, const std::string& defined_in);

}  // namespace onnxopt::server

#endif  // ONNXOPT_SERVER_FLAG_SPELLING_H_
