// The onnxopt commands, a file each in this folder. Each New...Command adds its subcommand to `app`,
// binds its options and returns what runs it; server commands read the global connection options.
#ifndef ONNXOPT_CLIENT_COMMANDS_COMMANDS_H_
#define ONNXOPT_CLIENT_COMMANDS_COMMANDS_H_

#include <memory>
#include <vector>

#include "CLI/CLI.hpp"
#include "client/commands/command.h"
#include "client/commands/shared_options.h"

namespace onnxopt::cli {

std::unique_ptr<Command> NewSubmitCommand(CLI::App& app, const ConnectionOptions& connection);
std::unique_ptr<Command> NewStatusCommand(CLI::App& app, const ConnectionOptions& connection);
std::unique_ptr<Command> NewListCommand(CLI::App& app, const ConnectionOptions& connection);
std::unique_ptr<Command> NewWatchCommand(CLI::App& app, const ConnectionOptions& connection);
std::unique_ptr<Command> NewCancelCommand(CLI::App& app, const ConnectionOptions& connection);
std::unique_ptr<Command> NewDeleteCommand(CLI::App& app, const ConnectionOptions& connection);
std::unique_ptr<Command> NewDownloadCommand(CLI::App& app, const ConnectionOptions& connection);
std::unique_ptr<Command> NewReportCommand(CLI::App& app, const ConnectionOptions& connection);
std::unique_ptr<Command> NewPassesCommand(CLI::App& app, const ConnectionOptions& connection);
std::unique_ptr<Command> NewHealthCommand(CLI::App& app, const ConnectionOptions& connection);
std::unique_ptr<Command> NewInfoCommand(CLI::App& app, const ConnectionOptions& connection);
// Local: the optimizer library in this process, no server.
std::unique_ptr<Command> NewOptimizeCommand(CLI::App& app);
std::unique_ptr<Command> NewCompareCommand(CLI::App& app);
std::unique_ptr<Command> NewAdaptersCommand(CLI::App& app);

// Every command, in the order --help lists them.
std::vector<std::unique_ptr<Command>> AddCommands(CLI::App& app, const ConnectionOptions& connection);

}  // namespace onnxopt::cli

#endif  // ONNXOPT_CLIENT_COMMANDS_COMMANDS_H_
