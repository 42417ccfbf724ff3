// What every onnxopt command shares: exit codes, how a failure is printed, typed flags bound by CLI11,
// and the Command interface each subcommand (one file each in this folder) implements.
#ifndef ONNXOPT_CLIENT_COMMANDS_COMMAND_H_
#define ONNXOPT_CLIENT_COMMANDS_COMMAND_H_

#include <string>
#include <string_view>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "onnxopt/v1/service.pb.h"

namespace onnxopt::cli {

// Exit codes scripts can rely on.
enum ExitCode : int {
  kOk = 0,
  kJobFailed = 1,    // the job (or a local optimize/compare) failed, e.g. parity
  kUsage = 2,        // bad command line
  kServerError = 3,  // unreachable server or a server-side error (UNAVAILABLE, INTERNAL, RESOURCE_EXHAUSTED...)
  kCancelled = 4,    // the job was cancelled
  kRejected = 5,     // the input was refused (INVALID_ARGUMENT, NOT_FOUND, DATA_LOSS, FAILED_PRECONDITION)
};

int ExitFor(const absl::Status& status);
int ExitForJob(const v1::Job& job);
// Prints "onnxopt: CODE: message" to stderr; returns the status's exit code.
int Fail(const absl::Status& status);

// A flag's value and whether the command line gave it (an empty value may be given: `--preset ""`).
// CLI11 2.1 binds no std::optional, so the option remembers.
template <typename T>
struct Flag {
  T value{};
  CLI::Option* option = nullptr;
  bool given() const { return option != nullptr && option->count() > 0; }
  const T& operator*() const { return value; }
  const T* operator->() const { return &value; }
};

// Adds `--name TYPE` to `command`, bound to `flag`.
template <typename T>
CLI::Option* Bind(CLI::App* command, const std::string& name, Flag<T>* flag, const std::string& type,
                  const std::string& help) {
  flag->option = command->add_option(name, flag->value, help)->type_name(type);
  return flag->option;
}

// One subcommand: its constructor adds it to the app and binds its options to its own members; Run
// does the work once the command line is parsed and returns the exit code.
class Command {
 public:
  Command(CLI::App& app, const std::string& name, const std::string& description)
      : cli_(app.add_subcommand(name, description)) {}
  Command(const Command&) = delete;
  Command& operator=(const Command&) = delete;
  virtual ~Command() = default;

  virtual int Run() = 0;
  bool Chosen() const { return cli_->parsed(); }

 protected:
  CLI::App* cli() const { return cli_; }

 private:
  CLI::App* cli_;
};

}  // namespace onnxopt::cli

#endif  // ONNXOPT_CLIENT_COMMANDS_COMMAND_H_
