// Options several commands take, declared once: the connection (global), a run's config (--config,
// --device, --dim and the pipeline's --preset/--precision/--calibration), model repository layouts,
// labels, real inputs and -o. Each group is a struct CLI11 binds and a function that turns it into
// what the client or the optimizer takes, with the checks that need more than one flag.
#ifndef ONNXOPT_CLIENT_COMMANDS_SHARED_OPTIONS_H_
#define ONNXOPT_CLIENT_COMMANDS_SHARED_OPTIONS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "client/client.h"
#include "client/commands/command.h"
#include "client/model_repository.h"
#include "onnxopt/v1/service.pb.h"

namespace onnxopt::cli {

// Where the server is and how to reach it; given before or after the command.
struct ConnectionOptions {
  Flag<std::string> server, tls_ca, tls_cert, tls_key, token, tls_server_name, timeout;
};
void AddConnectionOptions(CLI::App* app, ConnectionOptions* options);
// Whether `word` is one of those options (its value is the next word, not a command).
bool IsConnectionOption(std::string_view word);
// Whether a server is named, by --server or $ONNXOPT_SERVER.
bool ServerNamed(const ConnectionOptions& options);
// A client of the named server (default 127.0.0.1:50051) with the TLS files, token and deadline the
// options or the environment give.
absl::StatusOr<std::unique_ptr<client::Client>> Connect(const ConnectionOptions& options);

// --device: cpu or cuda (gpu), any case.
std::optional<v1::Device> ParseDevice(const std::string& name);
// --dim: NAME=N with N >= 0 (0: an empty dim, such as a decoder's past before its first step).
std::optional<std::pair<std::string, int64_t>> ParseDim(const std::string& dim);
// --label: KEY=VALUE (the server checks the key's characters and the lengths).
std::optional<std::pair<std::string, std::string>> ParseLabel(const std::string& label);

// The config file (or the defaults) and the flags applied over it.
struct ConfigFlags {
  Flag<std::string> config, device, preset, precision, calibration;
  std::vector<std::string> dims;  // every --dim, in order
};
// What a run of two models reads of a config (compare): --config, --device, --dim.
void AddRunOptions(CLI::App* command, ConfigFlags* flags);
// A job's config: the run's options and the pipeline's --preset, --precision, --calibration.
void AddConfigOptions(CLI::App* command, ConfigFlags* flags);
absl::StatusOr<v1::OptimizationConfig> ConfigFrom(const ConfigFlags& flags);

// --layout and what goes with it: a model repository or GenAI folder at -o instead of a file.
struct RepositoryFlags {
  Flag<std::string> layout, model_name, version, max_batch_size, storage_uri, tokenizer, context_length, genai_type;
};
void AddRepositoryOptions(CLI::App* command, RepositoryFlags* flags);
// The repository to write at `out` (nullopt without --layout), checked, the version's folder included,
// before anything runs.
absl::StatusOr<std::optional<client::RepositoryOptions>> RepositoryFrom(const RepositoryFlags& flags,
                                                                        const Flag<std::string>& out);

// Repeatable --label KEY=VALUE.
void AddLabelOption(CLI::App* command, std::vector<std::string>* labels, const std::string& help);
std::map<std::string, std::string> LabelsFrom(const std::vector<std::string>& labels);

// --inputs DIR: real inputs to validate on.
void AddInputsOption(CLI::App* command, Flag<std::string>* inputs);
// -o: where a result goes ("out/" names the folder "out": its parent is where a result is staged).
CLI::Option* AddOutOption(CLI::App* command, Flag<std::string>* out, const std::string& type, const std::string& help);
// JOB: the job's name, required.
void AddJobArgument(CLI::App* command, std::string* job);
// --json with the usual help.
void AddJsonFlag(CLI::App* command, bool* json);

}  // namespace onnxopt::cli

#endif  // ONNXOPT_CLIENT_COMMANDS_SHARED_OPTIONS_H_
