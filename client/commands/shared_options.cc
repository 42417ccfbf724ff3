#include "client/commands/shared_options.h"

#include <chrono>
#include <cstdlib>
#include <initializer_list>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "optimizer/config_enums.h"

namespace onnxopt::cli {
namespace {

constexpr char kDimUsage[] = "use NAME=N with N >= 0";

// An option whose values are the names of a config enum: they are its choices, and its help lists them, the
// default first, then `note`.
void BindEnum(CLI::App* command, const std::string& name, Flag<std::string>* flag, const std::string& type,
              const google::protobuf::EnumDescriptor* values, const std::string& note) {
  const std::vector<std::string> names = EnumNames(values);
  Bind(command, name, flag, type, absl::StrCat(absl::StrJoin(names, ", "), note))->check(CLI::IsMember(names));
}

// A CLI11 check from a function that returns "" for a good value, else what is wrong.
template <typename F>
CLI::Validator Check(F&& check) {
  return CLI::Validator([check](std::string& value) -> std::string { return check(value); }, "");
}

std::string FromEnvironment(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "";
}

// The flag's value, else the environment variable's.
std::string FlagOrEnvironment(const Flag<std::string>& flag, const char* variable) {
  return flag.given() ? *flag : FromEnvironment(variable);
}

// The name of the first of `flags` given ("--version"), or "".
std::string FirstGiven(std::initializer_list<const Flag<std::string>*> flags) {
  for (const Flag<std::string>* flag : flags) {
    if (flag->given()) return flag->option->get_name();
  }
  return "";
}

// The flags only --layout triton or kserve take, and those only --layout genai takes.
std::string FirstServingFlagGiven(const RepositoryFlags& flags) {
  return FirstGiven({&flags.model_name, &flags.version, &flags.max_batch_size, &flags.storage_uri});
}
std::string FirstGenaiFlagGiven(const RepositoryFlags& flags) {
  return FirstGiven({&flags.tokenizer, &flags.context_length, &flags.genai_type});
}

absl::Status ReadGenaiFlags(const RepositoryFlags& flags, client::RepositoryOptions* options) {
  if (const std::string flag = FirstServingFlagGiven(flags); !flag.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " is for --layout triton or kserve"));
  }
  options->genai.tokenizer_dir = *flags.tokenizer;
  options->genai.model_type = *flags.genai_type;
  if (flags.context_length.given() &&
      (!absl::SimpleAtoi(*flags.context_length, &options->genai.context_length) || options->genai.context_length < 1)) {
    return absl::InvalidArgumentError("--context-length needs a number of 1 or more");
  }
  return absl::OkStatus();
}

absl::Status ReadServingFlags(const RepositoryFlags& flags, client::RepositoryOptions* options) {
  if (const std::string flag = FirstGenaiFlagGiven(flags); !flag.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " is for --layout genai"));
  }
  options->model_name = *flags.model_name;
  if (options->model_name.empty()) return absl::InvalidArgumentError("--layout needs --model-name");
  if (flags.version.given() && !absl::SimpleAtoi(*flags.version, &options->version)) {
    return absl::InvalidArgumentError("--version needs a number");
  }
  if (flags.max_batch_size.given() && !absl::SimpleAtoi(*flags.max_batch_size, &options->max_batch_size)) {
    return absl::InvalidArgumentError("--max-batch-size needs a number");
  }
  options->storage_uri = *flags.storage_uri;
  if (!options->storage_uri.empty() && options->layout != client::RepositoryLayout::kKServe) {
    return absl::InvalidArgumentError("--storage-uri is for --layout kserve");
  }
  return absl::OkStatus();
}

}  // namespace

void AddConnectionOptions(CLI::App* app, ConnectionOptions* options) {
  Bind(app, "--server", &options->server, "ADDR", "onnxopt-server address");
  Bind(app, "--tls-ca", &options->tls_ca, "FILE",
       "TLS: CA bundle that signed the server's certificate (else $ONNXOPT_TLS_CA; neither and no client "
       "certificate: plaintext)");
  Bind(app, "--tls-cert", &options->tls_cert, "FILE", "TLS: client certificate for mutual TLS (else $ONNXOPT_TLS_CERT)");
  Bind(app, "--tls-key", &options->tls_key, "FILE", "TLS: the client certificate's key (else $ONNXOPT_TLS_KEY)");
  Bind(app, "--token", &options->token, "TOKEN",
       "bearer token for servers with --auth-tokens-file (else $ONNXOPT_TOKEN; the environment keeps it out of the "
       "process list)");
  Bind(app, "--tls-server-name", &options->tls_server_name, "NAME",
       "TLS: the name to check the server's certificate against (default: the --server host; for probes dialing "
       "localhost)");
  Bind(app, "--timeout", &options->timeout, "SECONDS",
       "give up after this long, retries included (DEADLINE_EXCEEDED; default: no limit; health: 5 s)")
      ->check(Check([](const std::string& value) -> std::string {
        double seconds = 0;
        return absl::SimpleAtod(value, &seconds) && seconds > 0 ? "" : "needs a number of seconds > 0";
      }));
}

bool IsConnectionOption(std::string_view word) {
  return word == "--server" || word == "--tls-ca" || word == "--tls-cert" || word == "--tls-key" ||
         word == "--token" || word == "--tls-server-name" || word == "--timeout";
}

bool ServerNamed(const ConnectionOptions& options) {
  return options.server.given() || !FromEnvironment("ONNXOPT_SERVER").empty();
}

absl::StatusOr<std::unique_ptr<client::Client>> Connect(const ConnectionOptions& options) {
  const client::TlsFiles tls{FlagOrEnvironment(options.tls_ca, "ONNXOPT_TLS_CA"),
                             FlagOrEnvironment(options.tls_cert, "ONNXOPT_TLS_CERT"),
                             FlagOrEnvironment(options.tls_key, "ONNXOPT_TLS_KEY")};
  auto credentials = client::ChannelCredentialsFor(tls);
  if (!credentials.ok()) return credentials.status();
  std::string address = FlagOrEnvironment(options.server, "ONNXOPT_SERVER");  // set but empty: unset
  if (address.empty()) address = "127.0.0.1:50051";
  auto connection = std::make_unique<client::Client>(address, *credentials, *options.tls_server_name);
  connection->set_token(FlagOrEnvironment(options.token, "ONNXOPT_TOKEN"));
  double seconds = 0;
  if (options.timeout.given() && absl::SimpleAtod(*options.timeout, &seconds)) {
    connection->set_deadline(std::chrono::system_clock::now() +
                             std::chrono::duration_cast<std::chrono::system_clock::duration>(
                                 std::chrono::duration<double>(seconds)));
  }
  return connection;
}

std::optional<v1::Device> ParseDevice(const std::string& name) {
  const std::string device = absl::AsciiStrToLower(name);
  if (device == "cpu") return v1::DEVICE_CPU;
  if (device == "cuda" || device == "gpu") return v1::DEVICE_CUDA;
  return std::nullopt;
}

std::optional<std::pair<std::string, int64_t>> ParseDim(const std::string& dim) {
  const size_t equals = dim.find('=');
  int64_t value = 0;
  if (equals == std::string::npos || equals == 0 || !absl::SimpleAtoi(dim.substr(equals + 1), &value) || value < 0) {
    return std::nullopt;
  }
  return std::make_pair(dim.substr(0, equals), value);
}

std::optional<std::pair<std::string, std::string>> ParseLabel(const std::string& label) {
  const size_t equals = label.find('=');
  if (equals == std::string::npos || equals == 0) return std::nullopt;
  return std::make_pair(label.substr(0, equals), label.substr(equals + 1));
}

void AddRunOptions(CLI::App* command, ConfigFlags* flags) {
  Bind(command, "--config", &flags->config, "FILE.json", "an onnxopt.v1.OptimizationConfig in protobuf JSON");
  Bind(command, "--device", &flags->device, "cpu|cuda", "where parity and the benchmark run")
      ->check(Check([](const std::string& name) -> std::string { return ParseDevice(name) ? "" : "use cpu or cuda"; }));
  command->add_option("--dim", flags->dims, "NAME=N: a dynamic dimension's value (repeatable)")
      ->type_name("NAME=N")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->check(Check([](const std::string& dim) -> std::string { return ParseDim(dim) ? "" : kDimUsage; }));
}

void AddConfigOptions(CLI::App* command, ConfigFlags* flags) {
  AddRunOptions(command, flags);
  BindEnum(command, "--preset", &flags->preset, "NAME", v1::Pipelines::Preset_descriptor(),
           " (auto: the best pipeline for what the model is)");
  BindEnum(command, "--precision", &flags->precision, "MODE", v1::PrecisionConfig::Mode_descriptor(),
           " (auto: the fastest float precision that passes parity on the job's device)");
  BindEnum(command, "--calibration", &flags->calibration, "METHOD", v1::CalibrationConfig::Method_descriptor(),
           ": int8_static's calibration");
}

absl::StatusOr<v1::OptimizationConfig> ConfigFrom(const ConfigFlags& flags) {
  v1::OptimizationConfig config;
  if (flags.config.given()) {
    auto loaded = client::LoadConfigFile(*flags.config);
    if (!loaded.ok()) return loaded.status();
    config = *std::move(loaded);
  }
  if (flags.preset.given()) {
    v1::Pipelines::Preset preset;
    v1::Pipelines::Preset_Parse(*flags.preset, &preset);  // CLI11 checked the names against the enums
    config.set_preset(preset);
    config.clear_passes();  // the flag wins over a pass list in the file
  }
  if (flags.precision.given()) {
    v1::PrecisionConfig::Mode mode;
    v1::PrecisionConfig::Mode_Parse(*flags.precision, &mode);
    config.mutable_precision()->set_mode(mode);
  }
  if (flags.calibration.given()) {
    v1::CalibrationConfig::Method method;
    v1::CalibrationConfig::Method_Parse(*flags.calibration, &method);
    config.mutable_precision()->mutable_calibration()->set_method(method);
  }
  if (flags.device.given()) {
    const std::optional<v1::Device> device = ParseDevice(*flags.device);
    if (!device) return absl::InvalidArgumentError(absl::StrCat("--device ", *flags.device, ": use cpu or cuda"));
    config.mutable_benchmark()->set_device(*device);
  }
  for (const std::string& dim : flags.dims) {
    const auto parsed = ParseDim(dim);
    if (!parsed) return absl::InvalidArgumentError(absl::StrCat("--dim ", dim, ": ", kDimUsage));
    (*config.mutable_validation()->mutable_dim_values())[parsed->first] = parsed->second;
  }
  return config;
}

void AddRepositoryOptions(CLI::App* command, RepositoryFlags* flags) {
  Bind(command, "--layout", &flags->layout, "triton|kserve|genai",
       "write a model repository at -o: NAME/config.pbtxt and NAME/VERSION/model.onnx (kserve: and "
       "inferenceservice.yaml); genai: a folder ONNX Runtime GenAI loads (model.onnx, genai_config.json, the "
       "tokenizer)")
      ->check(CLI::IsMember({"triton", "kserve", "genai"}));
  Bind(command, "--model-name", &flags->model_name, "NAME", "the model's name in the repository (with --layout)");
  Bind(command, "--version", &flags->version, "N", "the model version folder (default 1; an existing one is refused)");
  Bind(command, "--max-batch-size", &flags->max_batch_size, "N",
       "config.pbtxt's max_batch_size where the batch dim is dynamic (default 8)");
  Bind(command, "--storage-uri", &flags->storage_uri, "URI",
       "kserve: where the repository will be served from (default pvc://onnxopt-models/<folder>)");
  Bind(command, "--tokenizer", &flags->tokenizer, "DIR",
       "genai: the Hugging Face folder whose tokenizer files go beside the model (its config.json and "
       "generation_config.json give the context length and token ids)");
  Bind(command, "--context-length", &flags->context_length, "N",
       "genai: the positions the model takes (default: config.json's max_position_embeddings, or the model's "
       "stored rotary table)");
  Bind(command, "--genai-type", &flags->genai_type, "TYPE",
       "genai: model.type (default: config.json's model_type where GenAI knows it, else decoder)");
}

absl::StatusOr<std::optional<client::RepositoryOptions>> RepositoryFrom(const RepositoryFlags& flags,
                                                                        const Flag<std::string>& out) {
  if (!flags.layout.given()) {
    if (const std::string flag = FirstServingFlagGiven(flags); !flag.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(flag, " needs --layout triton or kserve"));
    }
    if (const std::string flag = FirstGenaiFlagGiven(flags); !flag.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(flag, " needs --layout genai"));
    }
    return std::nullopt;
  }
  auto layout = client::ParseRepositoryLayout(*flags.layout);
  if (!layout.ok()) return layout.status();
  client::RepositoryOptions options;
  options.layout = *layout;
  absl::Status read = options.layout == client::RepositoryLayout::kGenai ? ReadGenaiFlags(flags, &options)
                                                                         : ReadServingFlags(flags, &options);
  if (!read.ok()) return read;
  if (absl::Status valid = client::CheckRepositoryOptions(options); !valid.ok()) return valid;
  if (!out.given()) return absl::InvalidArgumentError("--layout needs -o REPOSITORY");
  if (absl::Status free = client::CheckVersionFree(options, *out); !free.ok()) return free;
  return std::optional<client::RepositoryOptions>(options);
}

void AddLabelOption(CLI::App* command, std::vector<std::string>* labels, const std::string& help) {
  command->add_option("--label", *labels, help)
      ->type_name("KEY=VALUE")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->check(Check([](const std::string& label) -> std::string { return ParseLabel(label) ? "" : "use KEY=VALUE"; }));
}

std::map<std::string, std::string> LabelsFrom(const std::vector<std::string>& labels) {
  std::map<std::string, std::string> parsed_labels;
  for (const std::string& label : labels) {
    if (auto parsed = ParseLabel(label)) parsed_labels[parsed->first] = parsed->second;
  }
  return parsed_labels;
}

void AddInputsOption(CLI::App* command, Flag<std::string>* inputs) {
  Bind(command, "--inputs", inputs, "DIR",
       "real inputs to validate on: DIR/test_data_set_N/input_K.pb or DIR/NAME.pb (TensorProtos)");
}

CLI::Option* AddOutOption(CLI::App* command, Flag<std::string>* out, const std::string& type, const std::string& help) {
  return Bind(command, "-o", out, type, help)->transform(CLI::Validator(
      [](std::string& value) -> std::string {
        while (value.size() > 1 && value.back() == '/') value.pop_back();
        return "";
      },
      ""));
}

void AddJobArgument(CLI::App* command, std::string* job) {
  command->add_option("JOB", *job, "the job's name")->required();
}

void AddJsonFlag(CLI::App* command, bool* json) { command->add_flag("--json", *json, "print JSON (protobuf field names)"); }

}  // namespace onnxopt::cli
