// What a server says of itself: `passes` (also without a server: this onnxopt's own), `health` (a
// probe) and `info`.
#include <chrono>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/commands/commands.h"
#include "client/commands/server_command.h"
#include "client/report_format.h"
#include "optimizer/pass_catalog.h"
#include "optimizer/pass_registry.h"

namespace onnxopt::cli {
namespace {

int PrintPasses(const v1::ListPassesResponse& passes, bool json, const std::string& source) {
  if (json) {
    std::cout << client::ToJson(passes);
    return kOk;
  }
  if (!source.empty()) std::cout << source << "\n\n";
  for (const auto& pass : passes.passes()) std::cout << absl::StrFormat("%-32s %s\n", pass.name(), pass.description());
  std::cout << "\npresets:\n";
  for (const auto& preset : passes.presets()) {
    std::cout << absl::StrFormat("  %-10s %s\n", preset.name(), preset.description());
  }
  return kOk;
}

class PassesCommand : public ServerCommand {
 public:
  PassesCommand(CLI::App& app, const ConnectionOptions& connection)
      : ServerCommand(app, "passes",
                      "passes and presets (of the server given by --server or $ONNXOPT_SERVER, else of this onnxopt, "
                      "no server needed)",
                      connection) {
    AddJsonFlag(cli(), &json_);
  }

  int Run() override {
    if (ServerNamed(connection())) return ServerCommand::Run();
    // No server named: the passes this onnxopt itself has (the same library the server runs).
    return PrintPasses(DescribePasses(DefaultPassRegistry()), json_,
                       "this onnxopt's passes (--server or $ONNXOPT_SERVER asks a server)");
  }

 protected:
  int RunWith(client::Client& client) override {
    auto passes = client.ListPasses();
    if (!passes.ok()) return Fail(passes.status());
    return PrintPasses(*passes, json_, "");
  }

 private:
  bool json_ = false;
};

class HealthCommand : public ServerCommand {
 public:
  HealthCommand(CLI::App& app, const ConnectionOptions& connection)
      : ServerCommand(app, "health", "gRPC health check (a probe): exit 0 when SERVING, 1 otherwise", connection) {
    Bind(cli(), "--service", &service_, "NAME", "a service's health, e.g. onnxopt.v1.Optimizer (default: the server's)");
  }

 protected:
  // One try, no retries: a probe's answer is now (exit 0 SERVING, 1 anything else).
  int RunWith(client::Client& client) override {
    if (!connection().timeout.given()) client.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    auto serving = client.CheckHealth(*service_);
    if (!serving.ok()) {
      std::cerr << "onnxopt: health: " << absl::StatusCodeToString(serving.status().code()) << ": "
                << serving.status().message() << std::endl;
      return kJobFailed;
    }
    std::cout << (*serving == 1 ? "SERVING" : *serving == 2 ? "NOT_SERVING" : "UNKNOWN") << std::endl;
    return *serving == 1 ? kOk : kJobFailed;
  }

 private:
  Flag<std::string> service_;
};

void PrintServerInfo(const v1::ServerInfo& info) {
  std::cout << "onnxopt-server " << info.version() << "\nONNX Runtime   " << info.onnxruntime_version()
            << "\nonnx           " << info.onnx_version() << " (checker knows opsets up to " << info.max_opset()
            << ")\nproviders      " << absl::StrJoin(info.execution_providers(), ", ");
  for (const auto& provider : info.providers()) {
    std::cout << "\n  " << provider.name() << ": "
              << (provider.usable() ? "usable here" : absl::StrCat("not usable here (", provider.reason(), ")"));
  }
  std::cout << "\nworkers        " << info.workers() << ", queue capacity " << info.queue_capacity()
            << "\nreplica        " << info.replica_id() << " (role " << info.role() << ", " << info.job_store()
            << " job store)"
            << "\ndraining       " << (info.draining() ? "yes" : "no") << std::endl;
}

class InfoCommand : public ServerCommand {
 public:
  InfoCommand(CLI::App& app, const ConnectionOptions& connection)
      : ServerCommand(app, "info", "server version, ONNX Runtime version, execution providers", connection) {
    AddJsonFlag(cli(), &json_);
  }

 protected:
  int RunWith(client::Client& client) override {
    auto info = client.GetServerInfo();
    if (!info.ok()) return Fail(info.status());
    if (json_) {
      std::cout << client::ToJson(*info);
    } else {
      PrintServerInfo(*info);
    }
    return kOk;
  }

 private:
  bool json_ = false;
};

}  // namespace

std::unique_ptr<Command> NewPassesCommand(CLI::App& app, const ConnectionOptions& connection) {
  return std::make_unique<PassesCommand>(app, connection);
}
std::unique_ptr<Command> NewHealthCommand(CLI::App& app, const ConnectionOptions& connection) {
  return std::make_unique<HealthCommand>(app, connection);
}
std::unique_ptr<Command> NewInfoCommand(CLI::App& app, const ConnectionOptions& connection) {
  return std::make_unique<InfoCommand>(app, connection);
}

}  // namespace onnxopt::cli
