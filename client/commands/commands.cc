#include "client/commands/commands.h"

namespace onnxopt::cli {

std::vector<std::unique_ptr<Command>> AddCommands(CLI::App& app, const ConnectionOptions& connection) {
  std::vector<std::unique_ptr<Command>> commands;
  for (auto* add : {&NewSubmitCommand, &NewStatusCommand, &NewListCommand, &NewWatchCommand, &NewCancelCommand,
                    &NewDeleteCommand, &NewDownloadCommand, &NewReportCommand, &NewPassesCommand, &NewHealthCommand,
                    &NewInfoCommand}) {
    commands.push_back(add(app, connection));
  }
  for (auto* add : {&NewOptimizeCommand, &NewCompareCommand, &NewAdaptersCommand}) commands.push_back(add(app));
  return commands;
}

}  // namespace onnxopt::cli
