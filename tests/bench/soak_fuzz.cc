// onnxopt-soak: hostile input and crashes against the real server, with figures.
//
//   onnxopt-soak [--models=1000] [--kill-rounds=3] [--seed=1] [--job-timeout=30]
//
// Fuzz: mutated models from the project's fixtures, eight kinds in turn: bit flips, truncations, huge
// or negative input dims, initializers declaring more elements than their bytes hold, If nesting and
// Loop nesting up to 1024 deep, external data at hostile locations ("..", absolute paths, the job
// folder's own names), and random structural damage (a node removed, an operator renamed). Each goes
// through UploadBlob and CreateJob like any client's model; a job that is accepted is followed to its
// end. Counted: server crashes (the server is restarted and the run goes on), hangs (a job not final
// past its timeout and a margin), refusals and failures that carry no reason, and files the server
// wrote outside its data folder (its working directory and TMPDIR must stay empty).
//
// Kill: per round, a large upload and a batch of jobs are in flight when the server gets SIGKILL; after
// the restart the upload resumes from what the server kept, every accepted job must reach a final
// state, every artifact downloads with its SHA-256, and every stored blob still hashes to its name.
//
// Exit status 0 only when crashes, hangs, jobs lost, reasonless failures, outside writes and hash
// mismatches are all 0 (ctest runs a short round: soak_fuzz_quick).
#include <sys/wait.h>

#include <random>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "client/client.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "optimizer/model_io.h"
#include "optimizer/sha256.h"
#include "tests/e2e_harness.h"

namespace onnxopt {
namespace {

namespace fs = std::filesystem;
using testing::Clock;
using testing::FixturePath;
using testing::Slurp;

struct Options {
  int models = 1000;
  int kill_rounds = 3;
  uint64_t seed = 1;
  int job_timeout = 30;
};

class Server {
 public:
  explicit Server(fs::path root) : root_(std::move(root)) {
    for (const char* folder : {"data", "cwd", "tmp", "logs"}) fs::create_directories(root_ / folder);
  }
  ~Server() {
    if (pid_ > 0) Kill();
  }
  bool Start(int job_timeout) {
    const fs::path port_file = root_ / "port";
    fs::remove(port_file);
    ++starts_;
    pid_ = testing::Spawn({ONNXOPT_SERVER_BIN, "--listen=127.0.0.1:0", "--metrics_listen=",
                           "--data_dir=" + (root_ / "data").string(), "--port_file=" + port_file.string(),
                           "--workers=2", "--queue_capacity=256", "--job_memory_limit_mb=2048",
                           absl::StrCat("--job_timeout_seconds=", job_timeout), "--drain_grace_seconds=0"},
                          root_ / "logs" / absl::StrCat("server", starts_, ".out"),
                          root_ / "logs" / absl::StrCat("server", starts_, ".err"), root_ / "cwd",
                          {"TMPDIR=" + (root_ / "tmp").string()});
    const auto deadline = Clock::now() + std::chrono::seconds(30);
    while (!fs::exists(port_file) && Clock::now() < deadline && Alive()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (!fs::exists(port_file)) return false;
    address_ = "127.0.0.1:" + Slurp(port_file);
    return true;
  }
  bool Alive() {
    if (pid_ <= 0) return false;
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == 0) return true;
    pid_ = -1;
    return false;
  }
  void Kill() {
    if (pid_ <= 0) return;  // never kill(-1, ...)
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  const std::string& address() const { return address_; }
  const fs::path& root() const { return root_; }

 private:
  fs::path root_;
  pid_t pid_ = -1;
  int starts_ = 0;
  std::string address_;
};

// --- Mutations ---------------------------------------------------------------------------------------

onnx::ValueInfoProto FloatInput(const std::string& name) {
  return testing::FloatValue(name, {2});
}

// x -> If(c) { If(c) { ... Identity(x) } } `depth` deep (or Loop with one trip). Each level moves the
// levels below into itself: copying them made this quadratic, 15-20 s for a 1024-deep model.
onnx::ModelProto Nested(int depth, bool loop) {
  onnx::GraphProto inner;
  inner.set_name("body");
  *inner.add_node() = testing::MakeNode("Identity", {"x"}, {"y0"});
  *inner.add_output() = FloatInput("y0");
  for (int level = 1; level <= depth; ++level) {
    onnx::GraphProto outer;
    outer.set_name(absl::StrCat("level", level));
    const std::string out = absl::StrCat("y", level);
    onnx::NodeProto node;
    if (loop) {
      // Loop(trip=1, cond) with no carried values: the body's extra output is a scan output.
      node = testing::MakeNode("Loop", {"trip", "c"}, {out});
      onnx::GraphProto body = std::move(inner);
      onnx::ValueInfoProto iteration = testing::MakeValue("i", onnx::TensorProto::INT64, {});
      onnx::ValueInfoProto condition = testing::MakeValue("cond_in", onnx::TensorProto::BOOL, {});
      body.mutable_input()->Clear();
      *body.add_input() = iteration;
      *body.add_input() = condition;
      *body.add_node() = testing::MakeNode("Identity", {"cond_in"}, {"cond_out"});
      onnx::ValueInfoProto scanned = body.output(0);
      body.mutable_output()->Clear();
      *body.add_output() = testing::MakeValue("cond_out", onnx::TensorProto::BOOL, {});
      *body.add_output() = scanned;
      auto* attribute = node.add_attribute();
      attribute->set_name("body");
      attribute->set_type(onnx::AttributeProto::GRAPH);
      *attribute->mutable_g() = std::move(body);
    } else {
      // The nesting goes down the then branch; the else branch is one Identity (two nested branches
      // per level would double the model's size with every level).
      node = testing::MakeNode("If", {"c"}, {out});
      onnx::GraphProto flat;
      flat.set_name(absl::StrCat("else", level));
      *flat.add_node() = testing::MakeNode("Identity", {"x"}, {absl::StrCat("e", level)});
      *flat.add_output() = FloatInput(absl::StrCat("e", level));
      for (const char* branch : {"then_branch", "else_branch"}) {
        auto* attribute = node.add_attribute();
        attribute->set_name(branch);
        attribute->set_type(onnx::AttributeProto::GRAPH);
        *attribute->mutable_g() = std::string(branch) == "then_branch" ? std::move(inner) : std::move(flat);
      }
    }
    *outer.add_node() = std::move(node);
    *outer.add_output() = FloatInput(out);
    inner = std::move(outer);
  }
  onnx::GraphProto graph = std::move(inner);
  graph.set_name("nested");
  *graph.add_input() = FloatInput("x");
  *graph.add_input() = testing::MakeValue("c", onnx::TensorProto::BOOL, {});
  if (loop) *graph.add_initializer() = MakeInt64Tensor("trip", {1});
  return testing::MakeModel(graph, 14);
}

struct Mutant {
  std::string kind;
  std::string bytes;                                    // the model file
  std::vector<std::pair<std::string, std::string>> external;  // name in ModelRef -> file content
};

class Mutator {
 public:
  explicit Mutator(uint64_t seed) : random_(seed) {
    for (const char* fixture : {"cnn_tiny.onnx", "bert_tiny.onnx", "gpt2_tiny.onnx", "cnn_bn.onnx"}) {
      seeds_.push_back(Slurp(FixturePath(fixture)));
    }
  }

  Mutant Make(int index) {
    const std::string& seed = seeds_[Pick(seeds_.size())];
    onnx::ModelProto model;
    model.ParseFromString(seed);
    Mutant mutant;
    switch (index % 8) {
      case 0: {
        mutant.kind = "bit flips";
        mutant.bytes = seed;
        const int flips = 1 + static_cast<int>(Pick(16));
        for (int i = 0; i < flips; ++i) mutant.bytes[Pick(mutant.bytes.size())] ^= static_cast<char>(1 << Pick(8));
        break;
      }
      case 1:
        mutant.kind = "truncation";
        mutant.bytes = seed.substr(0, Pick(seed.size()));
        break;
      case 2: {
        mutant.kind = "huge or negative dims";
        const int64_t dims[] = {-7, 0, int64_t{1} << 40, INT64_MAX, -1};
        for (auto& input : *model.mutable_graph()->mutable_input()) {
          auto* shape = input.mutable_type()->mutable_tensor_type()->mutable_shape();
          if (shape->dim_size() > 0) shape->mutable_dim(static_cast<int>(Pick(shape->dim_size())))->set_dim_value(dims[Pick(5)]);
        }
        mutant.bytes = model.SerializeAsString();
        break;
      }
      case 3: {
        mutant.kind = "tensor declares more data than it has";
        for (auto& tensor : *model.mutable_graph()->mutable_initializer()) {
          if (tensor.dims_size() > 0 && Pick(2) == 0) tensor.set_dims(0, tensor.dims(0) * (Pick(2) ? 1000 : (1 << 30)));
        }
        mutant.bytes = model.SerializeAsString();
        break;
      }
      case 4:
        mutant.kind = "deep If nesting";
        mutant.bytes = Nested(std::vector<int>{16, 128, 1024}[Pick(3)], false).SerializeAsString();
        break;
      case 5:
        mutant.kind = "deep Loop nesting";
        mutant.bytes = Nested(std::vector<int>{16, 128, 512}[Pick(3)], true).SerializeAsString();
        break;
      case 6: {
        mutant.kind = "hostile external data location";
        static const char* kLocations[] = {"../../etc/passwd", "/etc/passwd", "a/../../b", "model.onnx",
                                           "inputs/x",         "digests.tsv", "./w.bin",   "dir/w.bin",
                                           "..",               ""};
        const std::string location = kLocations[Pick(10)];
        for (auto& tensor : *model.mutable_graph()->mutable_initializer()) {
          if (tensor.raw_data().empty()) continue;
          const std::string data = tensor.raw_data();
          tensor.clear_raw_data();
          tensor.set_data_location(onnx::TensorProto::EXTERNAL);
          auto* entry = tensor.add_external_data();
          entry->set_key("location");
          entry->set_value(location);
          // Sometimes the file is listed (under the hostile name), sometimes it is claimed longer than it is.
          if (Pick(2) == 0) mutant.external.push_back({location, Pick(2) ? data : data.substr(0, data.size() / 2)});
          break;
        }
        mutant.bytes = model.SerializeAsString();
        break;
      }
      default: {
        mutant.kind = "structural damage";
        auto* nodes = model.mutable_graph()->mutable_node();
        if (nodes->size() > 0) {
          const int victim = static_cast<int>(Pick(nodes->size()));
          if (Pick(2) == 0) {
            nodes->DeleteSubrange(victim, 1);
          } else {
            (*nodes)[victim].set_op_type(Pick(2) ? "NoSuchOperator" : "Reshape");
          }
        }
        mutant.bytes = model.SerializeAsString();
        break;
      }
    }
    return mutant;
  }

 private:
  size_t Pick(size_t n) { return n == 0 ? 0 : static_cast<size_t>(random_() % n); }
  std::mt19937_64 random_;
  std::vector<std::string> seeds_;
};

// --- Figures -----------------------------------------------------------------------------------------

struct Figures {
  int models = 0, refused = 0, failed = 0, succeeded = 0;
  int crashes = 0, hangs = 0, reasonless = 0, outside_writes = 0;
  std::map<std::string, int> kinds;
  int kill_rounds = 0, kill_jobs = 0, jobs_lost = 0, uploads_resumed = 0, uploads_restarted = 0;
  int hash_mismatches = 0, downloads = 0;
  bool ok() const { return crashes + hangs + reasonless + outside_writes + jobs_lost + hash_mismatches == 0; }
};

bool IsFinal(v1::JobState state) {
  return state == v1::SUCCEEDED || state == v1::FAILED || state == v1::CANCELLED;
}

// Uploads `bytes` as one blob; the digest.
absl::StatusOr<std::string> UploadBytes(client::Client& client, const fs::path& scratch, const std::string& bytes) {
  WriteFileAtomically(scratch, bytes).IgnoreError();
  absl::StatusOr<v1::Blob> blob = client.UploadFile(scratch);
  if (!blob.ok()) return blob.status();
  return blob->sha256();
}

// Restarts a server that died; counts the crash.
void EnsureRunning(Server& server, const Options& options, Figures* figures) {
  if (server.Alive()) return;
  ++figures->crashes;
  std::cerr << "onnxopt-soak: the server died; restarting it\n";
  server.Start(options.job_timeout);
}

void Fuzz(Server& server, const Options& options, Figures* figures) {
  Mutator mutator(options.seed);
  v1::OptimizationConfig config;
  config.mutable_benchmark()->set_skip(true);
  config.set_cache(false);
  const fs::path scratch = server.root() / "scratch.bin";
  constexpr int kBatch = 16;
  for (int first = 0; first < options.models; first += kBatch) {
    std::vector<std::string> accepted;
    client::Client client(server.address());
    for (int index = first; index < std::min(options.models, first + kBatch); ++index) {
      Mutant mutant = mutator.Make(index);
      ++figures->models;
      ++figures->kinds[mutant.kind];
      v1::ModelRef model;
      absl::StatusOr<std::string> digest = UploadBytes(client, scratch, mutant.bytes);
      absl::Status status = digest.status();
      if (status.ok()) {
        model.set_sha256(*digest);
        model.set_display_name(mutant.kind);
        for (const auto& [name, content] : mutant.external) {
          absl::StatusOr<std::string> file = UploadBytes(client, scratch, content);
          if (!file.ok()) continue;
          v1::ExternalDataFile* entry = model.add_external_data();
          entry->set_name(name);
          entry->set_sha256(*file);
        }
        absl::StatusOr<v1::Job> job = client.CreateJob(model, config);
        status = job.status();
        if (job.ok()) accepted.push_back(job->name());
      }
      if (!status.ok()) {
        if (!server.Alive()) {
          EnsureRunning(server, options, figures);
          continue;
        }
        ++figures->refused;
        if (status.message().empty() || status.code() == absl::StatusCode::kInternal ||
            status.code() == absl::StatusCode::kUnknown) {
          ++figures->reasonless;
          std::cerr << "onnxopt-soak: " << mutant.kind << " refused without a reason: " << status << "\n";
        }
      }
    }
    // Follow the batch's jobs to their end.
    const auto deadline = Clock::now() + std::chrono::seconds(options.job_timeout * (kBatch / 2 + 1) + 30);
    for (const std::string& name : accepted) {
      v1::Job job;
      while (true) {
        absl::StatusOr<v1::Job> current = client::Client(server.address()).GetJob(name);
        if (current.ok()) job = *current;
        if (current.ok() && IsFinal(job.state())) break;
        if (!server.Alive()) EnsureRunning(server, options, figures);
        if (Clock::now() > deadline) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      if (!IsFinal(job.state())) {
        ++figures->hangs;
        std::cerr << "onnxopt-soak: " << name << " did not end in time (" << v1::JobState_Name(job.state()) << ")\n";
      } else if (job.state() == v1::SUCCEEDED) {
        ++figures->succeeded;
      } else {
        ++figures->failed;
        if (job.error().reason() == v1::ErrorReason::REASON_UNSPECIFIED || job.error().message().empty()) {
          ++figures->reasonless;
          std::cerr << "onnxopt-soak: " << name << " failed without a reason\n";
        }
      }
    }
    EnsureRunning(server, options, figures);
  }
}

// The server's working directory and TMPDIR stay empty; nothing appears beside its data folder.
void CheckOutsideWrites(const Server& server, Figures* figures) {
  const std::set<std::string> expected = {"data", "cwd", "tmp", "logs", "port", "scratch.bin", "big.bin"};
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(server.root(), error)) {
    if (expected.count(entry.path().filename().string()) == 0) {
      ++figures->outside_writes;
      std::cerr << "onnxopt-soak: written outside the data folder: " << entry.path() << "\n";
    }
  }
  for (const char* folder : {"cwd", "tmp"}) {
    for (const auto& entry : fs::recursive_directory_iterator(server.root() / folder, error)) {
      ++figures->outside_writes;
      std::cerr << "onnxopt-soak: written outside the data folder: " << entry.path() << "\n";
    }
  }
}

// Every stored blob (every tenant's) still hashes to its name.
void CheckBlobs(const Server& server, Figures* figures) {
  std::error_code error;
  for (const auto& entry : fs::recursive_directory_iterator(server.root() / "data", error)) {
    if (entry.path().parent_path().filename() != "blobs" || !entry.is_regular_file()) continue;
    absl::StatusOr<std::string> digest = Sha256OfFile(entry.path());
    if (!digest.ok() || *digest != entry.path().filename().string()) {
      ++figures->hash_mismatches;
      std::cerr << "onnxopt-soak: stored blob " << entry.path() << " does not match its name\n";
    }
  }
}

void KillRounds(Server& server, const Options& options, Figures* figures) {
  std::mt19937_64 random(options.seed + 7);
  std::string big(8 << 20, '\0');
  for (char& c : big) c = static_cast<char>(random());
  const std::string big_digest = Sha256OfBytes(big);
  WriteFileAtomically(server.root() / "big.bin", big).IgnoreError();
  v1::OptimizationConfig slow;
  slow.mutable_benchmark()->set_iterations(100000);
  slow.mutable_benchmark()->set_time_budget_seconds(4);
  slow.set_cache(false);
  v1::OptimizationConfig quick;
  quick.mutable_benchmark()->set_skip(true);
  quick.set_cache(false);
  for (int round = 0; round < options.kill_rounds; ++round) {
    ++figures->kill_rounds;
    const std::string session = absl::StrCat("soak-resume-", options.seed, "-", round);
    std::vector<std::string> accepted;
    {
      client::Client client(server.address());
      absl::StatusOr<v1::ModelRef> model = client.UploadModel(FixturePath(round % 2 ? "cnn_bn.onnx" : "cnn_tiny.onnx"));
      for (int i = 0; model.ok() && i < 6; ++i) {
        absl::StatusOr<v1::Job> job = client.CreateJob(*model, i % 2 ? quick : slow);
        if (job.ok()) accepted.push_back(job->name());
      }
    }
    // A big upload, three of its eight chunks sent, the stream still open when the server dies.
    auto stub = v1::Optimizer::NewStub(grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    v1::Blob blob;
    auto writer = stub->UploadBlob(&context, &blob);
    for (int chunk = 0; chunk < 3; ++chunk) {
      v1::UploadBlobRequest request;
      request.set_sha256(big_digest);
      request.set_total_size(static_cast<int64_t>(big.size()));
      request.set_upload_id(session);
      request.set_offset(int64_t{chunk} << 20);
      request.set_data(big.substr(static_cast<size_t>(chunk) << 20, 1 << 20));
      writer->Write(request);
    }
    // Kill once a job runs (or after a while).
    const auto wait_running = Clock::now() + std::chrono::seconds(20);
    while (Clock::now() < wait_running) {
      absl::StatusOr<v1::Job> job = client::Client(server.address()).GetJob(accepted.empty() ? "" : accepted.front());
      if (job.ok() && job->state() != v1::QUEUED) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    server.Kill();
    context.TryCancel();
    writer->Finish();
    if (!server.Start(options.job_timeout)) {
      ++figures->crashes;
      std::cerr << "onnxopt-soak: the server does not start after kill -9\n";
      return;
    }
    client::Client client(server.address());
    // The upload resumes from what the server kept.
    v1::UploadStatus status;
    {
      grpc::ClientContext status_context;
      v1::GetUploadStatusRequest request;
      request.set_sha256(big_digest);
      request.set_upload_id(session);
      stub = v1::Optimizer::NewStub(grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials()));
      stub->GetUploadStatus(&status_context, request, &status);
    }
    if (status.committed_size() > 0) ++figures->uploads_resumed; else ++figures->uploads_restarted;
    {
      grpc::ClientContext resume_context;
      v1::Blob done;
      auto resume = stub->UploadBlob(&resume_context, &done);
      for (int64_t offset = status.committed_size(); offset <= static_cast<int64_t>(big.size()); offset += 1 << 20) {
        v1::UploadBlobRequest request;
        request.set_sha256(big_digest);
        request.set_total_size(static_cast<int64_t>(big.size()));
        request.set_upload_id(session);
        request.set_offset(offset);
        request.set_data(big.substr(static_cast<size_t>(offset), 1 << 20));
        request.set_finish_write(offset + (1 << 20) >= static_cast<int64_t>(big.size()));
        resume->Write(request);
        if (request.finish_write()) break;
      }
      resume->WritesDone();
      const grpc::Status finished = resume->Finish();
      if (!finished.ok()) {
        ++figures->hash_mismatches;
        std::cerr << "onnxopt-soak: the resumed upload failed: " << finished.error_message() << "\n";
      }
    }
    // Every accepted job ends; every artifact downloads with its digest.
    const auto deadline = Clock::now() + std::chrono::seconds(options.job_timeout * 4 + 60);
    for (const std::string& name : accepted) {
      ++figures->kill_jobs;
      v1::Job job;
      while (Clock::now() < deadline) {
        absl::StatusOr<v1::Job> current = client.GetJob(name);
        if (current.ok()) job = *current;
        if (!current.ok() || IsFinal(job.state())) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      if (!IsFinal(job.state())) {
        ++figures->jobs_lost;
        std::cerr << "onnxopt-soak: " << name << " did not reach a final state after kill -9\n";
        continue;
      }
      for (const v1::Artifact& artifact : job.result().artifacts()) {
        ++figures->downloads;
        absl::Status downloaded = client.Download(name, artifact.name(), server.root() / "scratch.bin");
        if (!downloaded.ok()) {
          ++figures->hash_mismatches;
          std::cerr << "onnxopt-soak: " << name << "/" << artifact.name() << ": " << downloaded << "\n";
        }
      }
    }
    CheckBlobs(server, figures);
  }
}

int Main(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto number = [&](const char* prefix, auto* into) {
      return absl::StartsWith(arg, prefix) && absl::SimpleAtoi(arg.substr(std::string(prefix).size()), into);
    };
    if (!number("--models=", &options.models) && !number("--kill-rounds=", &options.kill_rounds) &&
        !number("--seed=", &options.seed) && !number("--job-timeout=", &options.job_timeout)) {
      std::cerr << "usage: onnxopt-soak [--models=1000] [--kill-rounds=3] [--seed=1] [--job-timeout=30]\n";
      return 2;
    }
  }
  const fs::path root = fs::temp_directory_path() / absl::StrFormat("onnxopt_soak_%d", ::getpid());
  fs::remove_all(root);
  Figures figures;
  const auto started = Clock::now();
  {
    Server server(root);
    if (!server.Start(options.job_timeout)) {
      std::cerr << "onnxopt-soak: cannot start " << ONNXOPT_SERVER_BIN << "\n";
      return 1;
    }
    Fuzz(server, options, &figures);
    CheckOutsideWrites(server, &figures);
    KillRounds(server, options, &figures);
    CheckOutsideWrites(server, &figures);
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - started).count();
  std::cout << absl::StrFormat(
      "fuzz: %d models (", figures.models);
  bool first = true;
  for (const auto& [kind, count] : figures.kinds) {
    std::cout << (first ? "" : ", ") << count << " " << kind;
    first = false;
  }
  std::cout << absl::StrFormat(
      ")\n  %d refused at upload or CreateJob, %d jobs FAILED, %d SUCCEEDED\n"
      "  server crashes %d, hangs past the job timeout %d, refusals or failures without a reason %d, "
      "files written outside the data folder %d\n"
      "kill -9: %d rounds, %d accepted jobs, %d lost; %d uploads resumed after the kill, %d started over; "
      "%d artifacts downloaded, %d blobs or artifacts not matching their SHA-256\n"
      "%.0f s\n",
      figures.refused, figures.failed, figures.succeeded, figures.crashes, figures.hangs, figures.reasonless,
      figures.outside_writes, figures.kill_rounds, figures.kill_jobs, figures.jobs_lost, figures.uploads_resumed,
      figures.uploads_restarted, figures.downloads, figures.hash_mismatches, seconds);
  fs::remove_all(root);
  return figures.ok() ? 0 : 1;
}

}  // namespace
}  // namespace onnxopt

int main(int argc, char** argv) { return onnxopt::Main(argc, argv); }
