// onnxopt: the command-line client of onnxopt-server, plus local `optimize`, `compare` and
// `adapters`. Each command is a file in client/commands/; this file parses the command line with
// CLI11 and runs the command it chose.
#include <exception>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/commands/command.h"
#include "client/commands/commands.h"
#include "client/commands/shared_options.h"
#include "optimizer/optimize.h"
#include "optimizer/ort_runtime.h"

namespace {

using onnxopt::cli::Command;
using onnxopt::cli::kOk;
using onnxopt::cli::kServerError;
using onnxopt::cli::kUsage;

constexpr char kFooter[] = R"(CONFIG OPTIONS of submit, optimize and compare win over the --config file.
The server is --server ADDR, else $ONNXOPT_SERVER, else 127.0.0.1:50051.
Exit codes: 0 ok, 1 job failed, 2 usage, 3 server error, 4 cancelled, 5 input rejected.)";

// A word where the command goes that names none: say so (CLI11 would only ask for a command).
bool NamesUnknownCommand(CLI::App& app, int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    if (onnxopt::cli::IsConnectionOption(word)) {
      ++i;  // its value
    } else if (!absl::StartsWith(word, "-")) {
      try {
        app.get_subcommand(word);
      } catch (const CLI::OptionNotFound&) {
        std::cerr << "onnxopt: unknown command '" << word << "' (onnxopt --help lists them)\n";
        return true;
      }
      return false;
    }
  }
  return false;
}

int RunChosen(const std::vector<std::unique_ptr<Command>>& commands) {
  for (const auto& command : commands) {
    if (command->Chosen()) return command->Run();
  }
  return kUsage;  // unreachable: CLI11 requires one command
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("onnxopt: the command-line client of onnxopt-server, plus local optimize and compare", "onnxopt");
  app.require_subcommand(1, 1);
  app.set_version_flag("--version", absl::StrCat("onnxopt ", onnxopt::kOptimizerVersion, " (ONNX Runtime ",
                                                 onnxopt::OrtVersion(), ")"));
  app.fallthrough();  // --server may come after the command too
  app.footer(kFooter);
  onnxopt::cli::ConnectionOptions connection;
  onnxopt::cli::AddConnectionOptions(&app, &connection);
  const std::vector<std::unique_ptr<Command>> commands = onnxopt::cli::AddCommands(app, connection);

  if (NamesUnknownCommand(app, argc, argv)) return kUsage;
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);  // prints the help, or the error
    return code == 0 ? kOk : kUsage;
  }
  try {
    return RunChosen(commands);
  } catch (const std::exception& e) {
    std::cerr << "onnxopt: internal error: " << e.what() << std::endl;
    return kServerError;
  }
}
