// The service tried as an attacker would, through the real server and CLI: each test is one defect
// that hostile testing found (issue 9) and failed before its fix.
#include <sys/resource.h>

#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "client/client.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "optimizer/sha256.h"
#include "tests/e2e_harness.h"

namespace onnxopt {
namespace {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using testing::E2eTest;
using testing::FixturePath;
using testing::MakeModel;
using testing::MakeNode;
using testing::Slurp;

std::unique_ptr<v1::Optimizer::Stub> Stub(const std::string& address) {
  return v1::Optimizer::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
}

// A tensor whose bytes are "in" `location`, as far as the model says.
onnx::TensorProto ExternalInt64(const std::string& location) {
  onnx::TensorProto tensor;
  tensor.set_data_type(onnx::TensorProto::INT64);
  tensor.add_dims(1);
  tensor.set_data_location(onnx::TensorProto::EXTERNAL);
  auto* entry = tensor.add_external_data();
  entry->set_key("location");
  entry->set_value(location);
  return tensor;
}

onnx::SparseTensorProto SparseOver(const std::string& location) {
  onnx::SparseTensorProto sparse;
  sparse.add_dims(4);
  *sparse.mutable_values() = ExternalInt64(location);
  sparse.mutable_values()->set_name("w");
  onnx::TensorProto* indices = sparse.mutable_indices();
  indices->set_data_type(onnx::TensorProto::INT64);
  indices->add_dims(1);
  indices->add_int64_data(0);
  return sparse;
}

// Gather(sparse values, idx): were the values read, they would end up in the job's output or error.
fs::path SparseExfiltrationModel(const fs::path& dir, const std::string& location, bool as_constant) {
  onnx::GraphProto graph;
  if (as_constant) {
    onnx::NodeProto constant = MakeNode("Constant", {}, {"w"});
    auto* attribute = constant.add_attribute();
    attribute->set_name("sparse_value");
    attribute->set_type(onnx::AttributeProto::SPARSE_TENSOR);
    *attribute->mutable_sparse_tensor() = SparseOver(location);
    *graph.add_node() = constant;
  } else {
    *graph.add_sparse_initializer() = SparseOver(location);
  }
  *graph.add_node() = MakeNode("Gather", {"w", "idx"}, {"y"});
  onnx::ValueInfoProto idx;
  idx.set_name("idx");
  idx.mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::INT64);
  idx.mutable_type()->mutable_tensor_type()->mutable_shape()->add_dim()->set_dim_value(1);
  *graph.add_input() = idx;
  onnx::ValueInfoProto y = idx;
  y.set_name("y");
  *graph.add_output() = y;
  const fs::path path = dir / (as_constant ? "constant.onnx" : "sparse.onnx");
  std::ofstream(path, std::ios::binary) << MakeModel(graph).SerializeAsString();
  return path;
}

// 1. Sparse initializers (and sparse Constant values) with external data were neither checked by the
// server nor loaded by the worker, so ONNX Runtime read them relative to the server's working
// directory: any file there, 8 bytes a job, through the job's error text.
TEST_F(E2eTest, SparseExternalDataCannotReadFilesOnTheServer) {
  // The server runs in dir_, its job store at data/jobs.sqlite3 relative to that; the attacker's model
  // sits in a folder of its own, so nothing it names is its own file.
  StartServer({}, dir_);
  std::ofstream(dir_ / "secret.txt") << "TOPSECRET";
  fs::create_directories(dir_ / "attacker");
  const fs::path config = WriteFile("config.json", R"({"benchmark": {"skip": true}})");
  for (bool as_constant : {false, true}) {
    for (const std::string location : {"secret.txt", "data/jobs.sqlite3"}) {
      const fs::path model = SparseExfiltrationModel(dir_ / "attacker", location, as_constant);
      Result submit = Cli({"submit", model.string(), "--config", config.string(), "--wait"});
      EXPECT_EQ(submit.code, 5) << location << ": " << submit.out << submit.err;
      EXPECT_FALSE(absl::StrContains(submit.out + submit.err, "TOPSECRET"));
      EXPECT_TRUE(absl::StrContains(submit.err, "EXTERNAL_DATA_MISSING")) << submit.err;
      // The CLI looks for the file next to the model; straight at the API the server refuses it.
      client::Client client(address_);
      auto blob = client.UploadFile(model);
      ASSERT_TRUE(blob.ok()) << blob.status();
      v1::ModelRef reference;
      reference.set_sha256(blob->sha256());
      auto job = client.CreateJob(reference, *client::ParseConfigJson(R"({"benchmark": {"skip": true}})"));
      ASSERT_FALSE(job.ok()) << location << " was accepted as " << job->name();
      EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_TRUE(absl::StrContains(job.status().message(), "EXTERNAL_DATA_MISSING")) << job.status();
    }
  }
  EXPECT_EQ(Cli({"list"}).out, "") << "no job was created";
  EXPECT_EQ(StopServer(), 0);
}

// An external data file named like a file the job folder stages itself (a supplied input) would be
// staged over it, writing through a hard link into another stored blob.
TEST_F(E2eTest, ExternalDataCannotTakeTheJobFoldersOwnNames) {
  StartServer();
  client::Client client(address_);
  auto model = client.UploadFile(FixturePath("cnn_tiny.onnx"));
  ASSERT_TRUE(model.ok());
  for (const char* name : {"inputs/0.pb", "digests.tsv", "model.onnx", "inputs"}) {
    v1::ModelRef reference;
    reference.set_sha256(model->sha256());
    auto* file = reference.add_external_data();
    file->set_name(name);
    file->set_sha256(model->sha256());
    auto job = client.CreateJob(reference, {});
    EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_TRUE(absl::StrContains(job.status().message(), "EXTERNAL_DATA_PATH")) << job.status();
  }
}

// 2. An op type with invalid UTF-8 made the job's error text invalid for proto3: status, list and
// watch then failed for every client, and after a restart the job vanished and numbering broke.
TEST_F(E2eTest, InvalidUtf8FromAModelBreaksOnlyItsOwnJob) {
  StartServer();
  onnx::GraphProto graph;
  // Invalid UTF-8 in the op type, and a megabyte of it in a node name the error may quote.
  *graph.add_node() = MakeNode("Bad\xffOp", {"x"}, {"y"}, "node" + std::string(1 << 20, '\xfe'));
  *graph.add_input() = testing::FloatValue("x", {2});
  *graph.add_output() = testing::FloatValue("y", {2});
  const fs::path model = WriteFile("bad.onnx", MakeModel(graph).SerializeAsString());
  const fs::path config = WriteFile("config.json", R"({"benchmark": {"skip": true}})");
  Result submit = Cli({"submit", model.string(), "--config", config.string()});
  ASSERT_EQ(submit.code, 0) << submit.err;
  const std::string job = std::string(absl::StripTrailingAsciiWhitespace(submit.out));
  Result watch = Cli({"watch", job});
  EXPECT_EQ(watch.code, 1) << watch.out << watch.err;
  Result status = Cli({"status", job});
  EXPECT_EQ(status.code, 0) << status.err;
  EXPECT_TRUE(absl::StrContains(status.out, "FAILED")) << status.out;
  EXPECT_TRUE(absl::StrContains(status.out, "Bad\\xffOp")) << status.out;
  EXPECT_LT(status.out.size(), 16u << 10) << "a job's error stays small whatever the model holds";
  Result list = Cli({"list"});
  EXPECT_EQ(list.code, 0) << list.err;
  EXPECT_TRUE(absl::StrContains(list.out, job));
  EXPECT_EQ(Cli({"report", job, "--json"}).code, 0);

  EXPECT_EQ(StopServer(), 0);
  StartServer();
  EXPECT_TRUE(absl::StrContains(Cli({"status", job}).out, "FAILED")) << "the job survives a restart";
  Result next = Cli({"submit", FixturePath("cnn_tiny.onnx").string(), "--config", config.string(), "--wait"});
  EXPECT_EQ(next.code, 0) << "numbering still works: " << next.err;
}

// 3. Request ids were global: whoever used an id first decided what a later retry with that id got.
TEST_F(E2eTest, ARequestIdCannotHandBackSomeoneElsesJob) {
  StartServer();
  const fs::path config = WriteFile("config.json", R"({"benchmark": {"skip": true}})");
  Result theirs = Cli({"submit", FixturePath("cnn_tiny.onnx").string(), "--config", config.string(), "--request-id", "X"});
  ASSERT_EQ(theirs.code, 0) << theirs.err;
  const fs::path out = dir_ / "mine.onnx";
  Result mine = Cli({"submit", FixturePath("cnn_bn.onnx").string(), "--config", config.string(), "--request-id", "X",
                     "--wait", "-o", out.string()});
  EXPECT_EQ(mine.code, 5) << mine.out << mine.err;
  EXPECT_TRUE(absl::StrContains(mine.err, "REQUEST_ID_REUSED")) << mine.err;
  EXPECT_TRUE(absl::StrContains(mine.err, "another model")) << mine.err;
  EXPECT_FALSE(fs::exists(out));
  Result other_config = Cli({"submit", FixturePath("cnn_tiny.onnx").string(), "--request-id", "X"});
  EXPECT_EQ(other_config.code, 5) << other_config.err;
  EXPECT_TRUE(absl::StrContains(other_config.err, "another config")) << other_config.err;
  Result retry = Cli({"submit", FixturePath("cnn_tiny.onnx").string(), "--config", config.string(), "--request-id", "X"});
  EXPECT_EQ(retry.code, 0);
  EXPECT_EQ(retry.out, theirs.out) << "a true retry still gets its job";
}

// 4. One partial upload per blob, shared by everyone: garbage written under a real file's hash made the
// owner's upload fail with DATA_LOSS, and an upload held open made it fail with ABORTED.
TEST_F(E2eTest, AnotherClientCannotSpoilAnUpload) {
  StartServer();
  const fs::path model = FixturePath("bert_tiny.onnx");
  const std::string digest = *Sha256OfFile(model);
  const int64_t size = static_cast<int64_t>(fs::file_size(model));
  auto stub = Stub(address_);
  auto write_garbage = [&](grpc::ClientContext* context, v1::Blob* blob, int64_t bytes) {
    auto writer = stub->UploadBlob(context, blob);
    v1::UploadBlobRequest chunk;
    chunk.set_sha256(digest);
    chunk.set_total_size(size);
    chunk.set_data(std::string(static_cast<size_t>(bytes), 'X'));
    EXPECT_TRUE(writer->Write(chunk));
    return writer;
  };
  {
    grpc::ClientContext context;
    v1::Blob blob;
    auto writer = write_garbage(&context, &blob, std::min<int64_t>(size, 1 << 20) - 1);
    writer->WritesDone();
    EXPECT_EQ(writer->Finish().error_code(), grpc::StatusCode::FAILED_PRECONDITION);  // left unfinished
  }
  for (const char* upload_id : {"", "guessed"}) {
    v1::GetUploadStatusRequest request;
    request.set_sha256(digest);
    request.set_upload_id(upload_id);
    v1::UploadStatus status;
    grpc::ClientContext context;
    ASSERT_TRUE(stub->GetUploadStatus(&context, request, &status).ok());
    EXPECT_EQ(status.committed_size(), 0) << "nobody resumes a stranger's partial";
  }
  // And one held open, under a session of the attacker's, while the owner uploads.
  grpc::ClientContext held_context;
  v1::Blob held_blob;
  auto held = stub->UploadBlob(&held_context, &held_blob);
  {
    v1::UploadBlobRequest chunk;
    chunk.set_sha256(digest);
    chunk.set_total_size(size);
    chunk.set_upload_id("attacker");
    chunk.set_data(std::string(4096, 'X'));
    ASSERT_TRUE(held->Write(chunk));
  }
  auto attacker_holds = [&] {
    v1::GetUploadStatusRequest request;
    request.set_sha256(digest);
    request.set_upload_id("attacker");
    v1::UploadStatus status;
    grpc::ClientContext context;
    return stub->GetUploadStatus(&context, request, &status).ok() && status.committed_size() == 4096;
  };
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (!attacker_holds() && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(attacker_holds()) << "the attacker's upload is open on the server before the owner starts";
  const fs::path config = WriteFile("config.json", R"({"benchmark": {"skip": true}})");
  Result owner = Cli({"submit", model.string(), "--config", config.string(), "--wait", "-o", (dir_ / "out.onnx").string()});
  EXPECT_EQ(owner.code, 0) << owner.out << owner.err;
  held_context.TryCancel();
  held->Finish();
  EXPECT_TRUE(fs::exists(dir_ / "data" / "blobs" / digest));
}

long PeakResidentKiB(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (absl::StartsWith(line, "VmHWM:")) return std::stol(line.substr(6));
  }
  return -1;
}

// 5. CreateJob read the whole model blob into the server's memory to parse it: a 3 GiB junk blob
// took the server to 4 GB and stalled everyone else's requests while it did.
TEST_F(E2eTest, CreatingAJobKeepsTheServersMemoryFlat) {
  StartServer();
  constexpr int64_t kJunkBytes = int64_t{192} << 20;
  const fs::path junk = dir_ / "junk.onnx";
  {
    std::ofstream out(junk, std::ios::binary);
    const std::string block(1 << 20, '\x07');
    for (int64_t i = 0; i < kJunkBytes; i += static_cast<int64_t>(block.size())) out << block;
  }
  client::Client client(address_);
  auto blob = client.UploadFile(junk);
  ASSERT_TRUE(blob.ok()) << blob.status();
  fs::remove(junk);
  const long before = PeakResidentKiB(server_);
  ASSERT_GT(before, 0);
  v1::ModelRef reference;
  reference.set_sha256(blob->sha256());
  auto job = client.CreateJob(reference, {});
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(job.status().message(), "MODEL_PARSE_FAILED")) << job.status();
  const long after = PeakResidentKiB(server_);
  EXPECT_LT(after - before, 48 << 10) << "the server's peak resident memory grew from " << before << " KiB to "
                                      << after << " KiB for a " << (kJunkBytes >> 20) << " MiB blob";
  EXPECT_EQ(Cli({"info"}).code, 0);
}

// 6. The CLI followed a symbolic link named as external data and uploaded what it pointed to.
TEST_F(E2eTest, TheCliUploadsNoSymlinkedExternalData) {
  StartServer();
  fs::create_directories(dir_ / "model");
  fs::copy_file(FixturePath("mlp_external/model.onnx"), dir_ / "model" / "model.onnx");
  const fs::path outside = WriteFile("outside.bin", std::string(305152, 's'));
  fs::create_symlink(outside, dir_ / "model" / "weights.bin");
  Result submit = Cli({"submit", (dir_ / "model" / "model.onnx").string()});
  EXPECT_EQ(submit.code, 5) << submit.out << submit.err;
  EXPECT_TRUE(absl::StrContains(submit.err, "symbolic link")) << submit.err;
  EXPECT_FALSE(fs::exists(dir_ / "data" / "blobs" / *Sha256OfFile(outside))) << "nothing of it went up";

  // A link that stays inside the model's folder is refused too: only regular files go up.
  fs::remove(dir_ / "model" / "weights.bin");
  fs::copy_file(FixturePath("mlp_external/weights.bin"), dir_ / "model" / "real.bin");
  fs::create_symlink("real.bin", dir_ / "model" / "weights.bin");
  EXPECT_EQ(Cli({"submit", (dir_ / "model" / "model.onnx").string()}).code, 5);
}

// 7. A blob altered on disk was used silently; now the job fails, and the blob is dropped so the
// next submit stores it again.
TEST_F(E2eTest, AnAlteredBlobFailsItsJobAndIsStoredAgain) {
  StartServer();
  const fs::path config = WriteFile("config.json", R"({"benchmark": {"skip": true}})");
  const fs::path model = FixturePath("cnn_tiny.onnx");
  ASSERT_EQ(Cli({"submit", model.string(), "--config", config.string(), "--wait"}).code, 0);
  const fs::path stored = dir_ / "data" / "blobs" / *Sha256OfFile(model);
  // Flip one bit inside the largest weight's bytes: still a model that parses, no longer the upload.
  std::string bytes = Slurp(stored);
  onnx::ModelProto parsed;
  ASSERT_TRUE(parsed.ParseFromString(bytes));
  std::string weight;
  for (const auto& tensor : parsed.graph().initializer()) {
    if (tensor.raw_data().size() > weight.size()) weight = tensor.raw_data();
  }
  const size_t at = bytes.find(weight);
  ASSERT_NE(at, std::string::npos);
  bytes[at + weight.size() / 2] ^= 0x01;
  std::ofstream(stored, std::ios::binary | std::ios::trunc) << bytes;
  // Run again, not answered from the result cache (which would not read the blob at all).
  const fs::path rerun = WriteFile("rerun.json", R"({"benchmark": {"skip": true}, "cache": false})");
  Result corrupt = Cli({"submit", model.string(), "--config", rerun.string(), "--wait"});
  EXPECT_EQ(corrupt.code, 1) << corrupt.out << corrupt.err;
  EXPECT_TRUE(absl::StrContains(corrupt.err, "BLOB_CORRUPT")) << corrupt.err;
  EXPECT_FALSE(fs::exists(stored));
  Result again = Cli({"submit", model.string(), "--config", config.string(), "--wait"});
  EXPECT_EQ(again.code, 0) << again.err;
}

// Bytes that rot on disk are found and never served (issue 45). A download that reads an artifact
// whole checks it against its recorded SHA-256: the stream ends DATA_LOSS (ARTIFACT_CORRUPT) and the
// artifact is marked, so later downloads are refused at once. The scrub at start reads every blob and
// artifact: it deletes a corrupt blob (the next upload stores it again) and marks a corrupt artifact.
TEST_F(E2eTest, RottenBytesAreFoundByDownloadsAndTheScrubAndNeverServed) {
  StartServer();
  const fs::path config = WriteFile("config.json", R"({"benchmark": {"skip": true}})");
  auto flip_a_byte = [](const fs::path& path) {
    std::string bytes = Slurp(path);
    ASSERT_FALSE(bytes.empty()) << path;
    bytes[bytes.size() / 2] ^= 0x01;
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  };
  auto job_of = [&](const char* fixture) {
    Result submitted = Cli({"submit", FixturePath(fixture).string(), "--config", config.string(), "--wait", "-o",
                            (dir_ / (std::string(fixture) + ".out")).string()});
    EXPECT_EQ(submitted.code, 0) << submitted.err;
    return std::string(absl::StripTrailingAsciiWhitespace(submitted.out.substr(0, submitted.out.find('\n'))));
  };
  auto model_of = [&](const std::string& job) {
    return dir_ / "data" / "jobs" / std::string(absl::StripPrefix(job, "jobs/")) / "output" / "model.onnx";
  };
  auto refused = [&](const std::string& job) {
    const fs::path out = dir_ / "fetched.onnx";
    Result download = Cli({"download", job, "-o", out.string()});
    EXPECT_EQ(download.code, 5) << download.out << download.err;
    EXPECT_TRUE(absl::StrContains(download.err, "ARTIFACT_CORRUPT")) << download.err;
    EXPECT_FALSE(fs::exists(out));
    return absl::StrContains(Cli({"status", job, "--json"}).out, "\"corrupt\": true");
  };

  // Found by a download.
  const std::string read_whole = job_of("cnn_tiny.onnx");
  flip_a_byte(model_of(read_whole));
  EXPECT_TRUE(refused(read_whole)) << "the download marks it";
  EXPECT_TRUE(refused(read_whole)) << "and the next is refused before a byte is sent";

  // Found by the scrub at the next start: an artifact and the blob of the model it was made from.
  const std::string scrubbed = job_of("cnn_bn.onnx");
  const fs::path blob = dir_ / "data" / "blobs" / *Sha256OfFile(FixturePath("cnn_bn.onnx"));
  ASSERT_TRUE(fs::exists(blob));
  EXPECT_EQ(StopServer(), 0);
  flip_a_byte(model_of(scrubbed));
  flip_a_byte(blob);
  StartServer();
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  while (fs::exists(blob) && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(fs::exists(blob)) << "the scrub deletes a corrupt blob";
  bool marked = false;
  while (!marked && Clock::now() < deadline) {
    marked = absl::StrContains(Cli({"status", scrubbed, "--json"}).out, "\"corrupt\": true");
    if (!marked) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(marked) << "the scrub marks a corrupt artifact";
  EXPECT_TRUE(refused(scrubbed));
  EXPECT_TRUE(absl::StrContains(Slurp(dir_ / "server.err"), "scrub: ")) << "the scrub logs what it read";
  // The model uploads again and runs: nothing of the rot is left in its way.
  const fs::path rerun = WriteFile("rerun.json", R"({"benchmark": {"skip": true}, "cache": false})");
  Result again = Cli({"submit", FixturePath("cnn_bn.onnx").string(), "--config", rerun.string(), "--wait", "-o",
                      (dir_ / "again.onnx").string()});
  EXPECT_EQ(again.code, 0) << again.err;
}

// 7. Abandoned partial uploads stayed in uploads/ forever.
TEST_F(E2eTest, AbandonedPartialUploadsExpire) {
  StartServer();
  auto stub = Stub(address_);
  const std::string digest = Sha256OfBytes("0123456789");
  for (const char* upload_id : {"abandoned", "recent"}) {
    grpc::ClientContext context;
    v1::Blob blob;
    auto writer = stub->UploadBlob(&context, &blob);
    v1::UploadBlobRequest chunk;
    chunk.set_sha256(digest);
    chunk.set_total_size(10);
    chunk.set_upload_id(upload_id);
    chunk.set_data("01234");
    writer->Write(chunk);
    writer->WritesDone();
    EXPECT_EQ(writer->Finish().error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  }
  auto committed = [&](const std::string& upload_id) {
    v1::GetUploadStatusRequest request;
    request.set_sha256(digest);
    request.set_upload_id(upload_id);
    v1::UploadStatus status;
    grpc::ClientContext context;
    return stub->GetUploadStatus(&context, request, &status).ok() ? status.committed_size() : -1;
  };
  EXPECT_EQ(committed("abandoned"), 5);
  EXPECT_EQ(StopServer(), 0);
  // Make one of them two days old, as if its client went away then.
  const fs::path uploads = dir_ / "data" / "uploads";
  std::vector<fs::path> partials;
  for (const auto& entry : fs::directory_iterator(uploads)) partials.push_back(entry.path());
  ASSERT_EQ(partials.size(), 2u);
  const std::string abandoned = absl::StrCat(digest, ".", Sha256OfBytes("abandoned").substr(0, 32), ".partial");
  fs::last_write_time(uploads / abandoned, fs::file_time_type::clock::now() - std::chrono::hours(48));
  StartServer();
  stub = Stub(address_);
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (fs::exists(uploads / abandoned) && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(fs::exists(uploads / abandoned));
  EXPECT_EQ(committed("abandoned"), 0);
  EXPECT_EQ(committed("recent"), 5) << "a partial younger than the expiry age is kept for resuming";
}

// 7. Every job left an empty mat-debug-<pid>.log (ONNX Runtime's telemetry) in the temp folder.
// 8. ONNX Runtime 1.29's telemetry wrote a device id and an event store into the home folder and
//    looked up its upload endpoint, for every job and local run.
TEST_F(E2eTest, JobsAndLocalRunsLeaveNothingInTheTempOrHomeFolder) {
  const fs::path tmp = dir_ / "tmp";
  const fs::path home = dir_ / "home";
  fs::create_directories(tmp);
  fs::create_directories(home);
  const std::vector<std::string> env = {"TMPDIR=" + tmp.string(), "HOME=" + home.string()};
  StartServer({}, {}, env);
  const fs::path config = WriteFile("config.json", R"({"benchmark": {"iterations": 3}})");
  Result submit = Cli({"submit", FixturePath("cnn_tiny.onnx").string(), "--config", config.string(), "--wait"}, env);
  EXPECT_EQ(submit.code, 0) << submit.err;
  Result local = Cli({"optimize", FixturePath("cnn_tiny.onnx").string(), "-o", (dir_ / "local.onnx").string(),
                      "--config", config.string()}, env);
  EXPECT_EQ(local.code, 0) << local.err;
  EXPECT_EQ(StopServer(), 0);
  std::vector<std::string> left;
  for (const auto& entry : fs::recursive_directory_iterator(tmp)) left.push_back(entry.path().string());
  EXPECT_TRUE(left.empty()) << "left in TMPDIR: " << absl::StrJoin(left, ", ");
  std::vector<std::string> at_home;
  for (const auto& entry : fs::recursive_directory_iterator(home)) at_home.push_back(entry.path().string());
  EXPECT_TRUE(at_home.empty()) << "written to HOME: " << absl::StrJoin(at_home, ", ");
  for (const auto& entry : fs::recursive_directory_iterator(dir_ / "data" / "jobs")) {
    EXPECT_FALSE(absl::StrContains(entry.path().filename().string(), "mat-debug")) << entry.path();
  }
}

// A full disk: an upload that does not fit is RESOURCE_EXHAUSTED and leaves no partial file; a job whose
// results cannot be written, nor its state stored, still ends, visibly. Needs a small tmpfs (root).
TEST_F(E2eTest, AFullDiskRefusesUploadsAndLeavesNoJobRunning) {
  const fs::path data = dir_ / "data";
  std::string why;
  const auto disk = testing::MountSmallDisk(data, "4m", &why);
  if (disk == nullptr) GTEST_SKIP() << why;
  StartServer();
  auto fill = [&](const fs::path& file, int64_t leave) {
    std::ofstream out(file, std::ios::binary);
    const std::string block(4096, 'F');
    std::error_code error;
    while (out && static_cast<int64_t>(fs::space(data, error).available) > leave) out.write(block.data(), block.size());
  };
  fill(data / "filler", 200 << 10);  // room for a small CNN, not for bert_tiny (351 KB)
  const fs::path config = WriteFile("config.json", R"({"benchmark": {"skip": true}})");
  Result big = Cli({"submit", FixturePath("bert_tiny.onnx").string(), "--config", config.string()});
  EXPECT_NE(big.code, 0);
  EXPECT_TRUE(absl::StrContains(big.err, "RESOURCE_EXHAUSTED: DISK_FULL")) << big.err;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(data / "uploads", error)) ADD_FAILURE() << "left behind: " << entry.path();
  EXPECT_FALSE(fs::exists(data / "blobs" / *Sha256OfFile(FixturePath("bert_tiny.onnx"))));

  // A job that runs while the disk fills up completely.
  Result submitted = Cli({"submit", FixturePath("cnn_tiny.onnx").string(), "--config", LongJobConfig().string()});
  ASSERT_EQ(submitted.code, 0) << submitted.err;
  const std::string job = std::string(absl::StripTrailingAsciiWhitespace(submitted.out));
  ASSERT_TRUE(WaitForStatus(job, "RUNNING"));
  fill(data / "filler2", 0);
  std::ofstream(data / "filler3", std::ios::binary) << std::string(1 << 20, 'F');  // whatever was left
  const auto deadline = Clock::now() + std::chrono::seconds(150);
  std::string status;
  while (Clock::now() < deadline) {
    status = Cli({"status", job}).out;
    if (absl::StrContains(status, "SUCCEEDED") || absl::StrContains(status, "FAILED")) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  EXPECT_TRUE(absl::StrContains(status, "FAILED") || absl::StrContains(status, "SUCCEEDED"))
      << "the job ended, whatever the disk: " << status;
  if (absl::StrContains(status, "FAILED")) {
    EXPECT_TRUE(absl::StrContains(status, "DISK_FULL")) << "the reason is named: " << status;
  }

  // Space returns: the service resumes by itself, and the job's end, which SQLite may have refused while the
  // disk was full (the store keeps it and writes it with a later update), is on disk and survives a restart.
  for (const char* filler : {"filler", "filler2", "filler3"}) fs::remove(data / filler);
  const fs::path skip = WriteFile("skip.json", R"({"validation": {"skip": true}, "benchmark": {"skip": true}})");
  Result resumed = Cli({"submit", FixturePath("cnn_tiny.onnx").string(), "--config", skip.string(), "--wait", "-o",
                        (dir_ / "resumed.onnx").string()});
  EXPECT_EQ(resumed.code, 0) << resumed.err;
  EXPECT_EQ(StopServer(), 0);
  StartServer();
  const std::string ended = absl::StrContains(status, "FAILED") ? "FAILED" : "SUCCEEDED";
  const std::string after_restart = Cli({"status", job}).out;
  EXPECT_TRUE(absl::StrContains(after_restart, ended)) << "before: " << status << "\nafter the restart: "
                                                       << after_restart;
  if (ended == "SUCCEEDED") {  // nothing half-written: what it published downloads whole and matches
    Result downloaded = Cli({"download", job, "-o", (dir_ / "full_disk_result").string()});
    EXPECT_EQ(downloaded.code, 0) << downloaded.err;
  }
  EXPECT_EQ(StopServer(), 0);
}

// 7. Limits answer with the code for a limit, and priorities are bounded.
TEST_F(E2eTest, LimitsAnswerResourceExhaustedAndPrioritiesAreBounded) {
  StartServer({"--max-upload-bytes=1000"});
  client::Client client(address_);
  auto blob = client.UploadFile(FixturePath("cnn_tiny.onnx"));
  EXPECT_EQ(blob.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(blob.status().message(), "UPLOAD_TOO_LARGE")) << blob.status();
  EXPECT_EQ(StopServer(), 0);
  StartServer();
  Result high = Cli({"submit", FixturePath("cnn_tiny.onnx").string(), "--config",
                     WriteFile("config.json", R"({"priority": 2147483647})").string()});
  EXPECT_EQ(high.code, 5) << high.err;
  EXPECT_TRUE(absl::StrContains(high.err, "priority")) << high.err;
}

// 8. A worker whose report.pb does not parse (disk corruption, a truncated write) had its job succeed
// with an empty report: no parity, no benchmark, a result nobody checked. It fails now, with the reason.
TEST_F(E2eTest, AJobWhoseWorkerReportDoesNotParseFails) {
  const fs::path real_worker = fs::path(ONNXOPT_SERVER_BIN).parent_path() / "onnxopt-worker";
  const fs::path worker = WriteFile("corrupting-worker.sh", absl::StrCat(
      "#!/bin/sh\n"
      "\"", real_worker.string(), "\" \"$@\"\n"
      "code=$?\n"
      "for arg in \"$@\"; do case \"$arg\" in --output_dir=*) out=\"${arg#--output_dir=}\";; esac; done\n"
      "if [ -n \"$out\" ] && [ -f \"$out/report.pb\" ]; then printf '\\377\\377\\377not a report' > \"$out/report.pb\"; fi\n"
      "exit $code\n"));
  fs::permissions(worker, fs::perms::owner_all);
  StartServer({absl::StrCat("--worker-binary=", worker.string())});
  const std::string job = Submit(FixturePath("cnn_tiny.onnx"), WriteFile("config.json", R"({"benchmark": {"skip": true}})"));
  Result watch = Cli({"watch", job});
  EXPECT_EQ(watch.code, 1) << "the job fails: " << watch.out << watch.err;
  Result status = Cli({"status", job});
  EXPECT_TRUE(absl::StrContains(status.out, "FAILED")) << status.out;
  EXPECT_TRUE(absl::StrContains(status.out, "WORKER_REPORT_CORRUPT")) << status.out;
  EXPECT_EQ(StopServer(), 0);
}

}  // namespace
}  // namespace onnxopt
