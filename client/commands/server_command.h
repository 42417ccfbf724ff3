// A command that talks to onnxopt-server: Run connects with the global options, then RunWith works.
#ifndef ONNXOPT_CLIENT_COMMANDS_SERVER_COMMAND_H_
#define ONNXOPT_CLIENT_COMMANDS_SERVER_COMMAND_H_

#include <string>

#include "client/client.h"
#include "client/commands/command.h"
#include "client/commands/shared_options.h"

namespace onnxopt::cli {

class ServerCommand : public Command {
 public:
  ServerCommand(CLI::App& app, const std::string& name, const std::string& description,
                const ConnectionOptions& connection)
      : Command(app, name, description), connection_(connection) {}

  int Run() override {
    auto client = Connect(connection_);
    if (!client.ok()) return Fail(client.status());
    return RunWith(**client);
  }

 protected:
  virtual int RunWith(client::Client& client) = 0;
  const ConnectionOptions& connection() const { return connection_; }

 private:
  const ConnectionOptions& connection_;
};

}  // namespace onnxopt::cli

#endif  // ONNXOPT_CLIENT_COMMANDS_SERVER_COMMAND_H_
