#include "server/blob_store.h"

#include "absl/strings/str_cat.h"

namespace onnxopt::server {
namespace fs = std::filesystem;
BlobUpload::BlobUpload(BlobStore* store, std::string sha256, int64_t total_size, int64_t committed)
    : store_(store), sha256_(std::move(sha256)), total_size_(total_size), committed_(committed) {
  out_.open(store_->PartialPathOf(sha256_), std::ios::binary | std::ios::app);
}

BlobUpload::~BlobUpload() {
  out_.close();
  store_->EndUpload(sha256_);
}

absl::Status BlobUpload::Append(int64_t offset, const std::string& data) {
  if (finished_) return absl::FailedPreconditionError("upload already finished");
  if (offset != committed_) {
    return absl::InvalidArgumentError(absl::StrCat("OFFSET_MISMATCH: write at offset ", offset,
                                                   " but the server holds ", committed_, " bytes; resume from there"));
  }
  if (committed_ + static_cast<int64_t>(data.size()) > total_size_) {
    return absl::InvalidArgumentError(absl::StrCat("SIZE_EXCEEDED: data passes the declared size of ", total_size_,
                                                   " bytes"));
  }
  out_.write(data.data(), static_cast<std::streamsize>(data.size()));
  out_.flush();
  if (!out_) return absl::InternalError("cannot write upload data (disk full?)");
  committed_ += static_cast<int64_t>(data.size());
  return absl::OkStatus();
}

absl::Status BlobUpload::Finish() {
  finished_ = true;
  out_.close();
  const fs::path partial = store_->PartialPathOf(sha256_);
  if (committed_ != total_size_) {
    return absl::InvalidArgumentError(absl::StrCat("SIZE_MISMATCH: upload finished after ", committed_,
                                                   " bytes but declared ", total_size_,
                                                   "; the partial upload is kept for resuming"));
  }
  absl::StatusOr<std::string> actual = Sha256OfFile(partial);
  if (!actual.ok()) return actual.status();
  if (*actual != sha256_) {
    std::error_code ignored;
    fs::remove(partial, ignored);
    return absl::DataLossError(absl::StrCat("CHECKSUM_MISMATCH: received data hashes to ", *actual, ", not the declared ",
                                            sha256_, "; the upload was discarded"));
  }
  std::error_code error;
  fs::rename(partial, store_->PathOf(sha256_), error);
  if (error) return absl::InternalError(absl::StrCat("cannot publish blob: ", error.message()));
  return absl::OkStatus();
}

BlobStore::BlobStore(fs::path root, int64_t max_blob_bytes) : root_(std::move(root)), max_blob_bytes_(max_blob_bytes) {}

absl::StatusOr<std::unique_ptr<BlobStore>> BlobStore::Open(const fs::path& root, int64_t max_blob_bytes) {
  std::error_code error;
  fs::create_directories(root / "blobs", error);
  if (!error) fs::create_directories(root / "uploads", error);
  if (error) return absl::InternalError(absl::StrCat("cannot create blob folders under ", root.string(), ": ", error.message()));
  return std::unique_ptr<BlobStore>(new BlobStore(root, max_blob_bytes));
}

fs::path BlobStore::PathOf(const std::string& sha256) const { return root_ / "blobs" / sha256; }
fs::path BlobStore::PartialPathOf(const std::string& sha256) const { return root_ / "uploads" / (sha256 + ".partial"); }

bool BlobStore::Exists(const std::string& sha256) const {
  std::error_code error;
  return IsValidSha256(sha256) && fs::is_regular_file(PathOf(sha256), error);
}

absl::StatusOr<int64_t> BlobStore::SizeOf(const std::string& sha256) const {
  std::error_code error;
  const auto size = fs::file_size(PathOf(sha256), error);
  if (error) return absl::NotFoundError(absl::StrCat("BLOB_NOT_FOUND: no blob ", sha256));
  return static_cast<int64_t>(size);
}

int64_t BlobStore::CommittedSize(const std::string& sha256) const {
  if (!IsValidSha256(sha256)) return 0;
  if (Exists(sha256)) return *SizeOf(sha256);
  std::error_code error;
  const auto size = fs::file_size(PartialPathOf(sha256), error);
  return error ? 0 : static_cast<int64_t>(size);
}

absl::StatusOr<std::unique_ptr<BlobUpload>> BlobStore::BeginUpload(const std::string& sha256, int64_t total_size) {
  if (!IsValidSha256(sha256)) {
    return absl::InvalidArgumentError("BAD_DIGEST: sha256 must be 64 lowercase hexadecimal digits");
  }
  if (total_size < 0) return absl::InvalidArgumentError("BAD_SIZE: total_size must be >= 0");
  if (total_size > max_blob_bytes_) {
    return absl::InvalidArgumentError(absl::StrCat("UPLOAD_TOO_LARGE: ", total_size, " bytes is over this server's limit of ",
                                                   max_blob_bytes_, " bytes per file"));
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!active_uploads_.insert(sha256).second) {
      return absl::AbortedError("UPLOAD_IN_PROGRESS: another upload of this blob is in progress; retry later");
    }
  }
  int64_t committed = CommittedSize(sha256);
  if (committed > total_size) {  // a stale partial of a different declared size cannot be resumed
    std::error_code ignored;
    fs::remove(PartialPathOf(sha256), ignored);
    committed = 0;
  }
  return std::unique_ptr<BlobUpload>(new BlobUpload(this, sha256, total_size, committed));
}

void BlobStore::EndUpload(const std::string& sha256) {
  std::lock_guard<std::mutex> lock(mutex_);
  active_uploads_.erase(sha256);
}

}  // namespace onnxopt::server
