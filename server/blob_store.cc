#include "server/blob_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "optimizer/failure.h"
#include "optimizer/model_io.h"

namespace onnxopt::server {
namespace fs = std::filesystem;
namespace {

// A session id nobody else can name, for uploads that bring none.
std::string AnonymousUploadId() {
  static std::mutex mutex;
  static std::mt19937_64 random{std::random_device{}()};
  std::lock_guard<std::mutex> lock(mutex);
  return absl::StrFormat("anonymous-%016x%016x", random(), random());
}

// Opens `path` and locks it (flock, exclusive, without waiting); -1 with errno set (EWOULDBLOCK: held
// elsewhere). The lock must be on the file the path names once it is held: a replica may have renamed
// the partial into place as a blob, or removed it, between the open and the lock.
int OpenLocked(const fs::path& path, int flags) {
  for (int tries = 0; tries < 3; ++tries) {
    const int fd = ::open(path.c_str(), flags, 0644);
    if (fd < 0) return -1;
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int failure = errno;
      ::close(fd);
      errno = failure;
      return -1;
    }
    struct stat held {}, named {};
    if (::fstat(fd, &held) == 0 && ::stat(path.c_str(), &named) == 0 && held.st_dev == named.st_dev &&
        held.st_ino == named.st_ino) {
      return fd;
    }
    ::close(fd);  // another file by now: open what the path names now
  }
  errno = EWOULDBLOCK;
  return -1;
}

}  // namespace

bool IsValidUploadId(const std::string& upload_id) {
  if (upload_id.empty() || upload_id.size() > 128) return false;
  for (char c : upload_id) {
    if (!absl::ascii_isalnum(c) && c != '-' && c != '_') return false;
  }
  return true;
}

absl::Status CheckUploadId(const std::string& upload_id) {
  if (upload_id.empty() || IsValidUploadId(upload_id)) return absl::OkStatus();
  return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::BAD_UPLOAD_ID,
                 "upload_id must be 1 to 128 characters of A-Z, a-z, 0-9, '-' and '_'");
}

BlobUpload::BlobUpload(BlobStore* store, std::string sha256, fs::path partial, int fd, int64_t total_size,
                       int64_t committed)
    : store_(store), sha256_(std::move(sha256)), partial_(std::move(partial)), fd_(fd), total_size_(total_size),
      committed_(committed) {}

BlobUpload::~BlobUpload() {
  Close();
  store_->EndUpload(partial_);
}

void BlobUpload::Close() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
  fd_ = -1;
}

absl::Status BlobUpload::Append(int64_t offset, const std::string& data) {
  if (finished_) return absl::FailedPreconditionError("upload already finished");
  if (offset != committed_) {
    return Failure(
        absl::StatusCode::kInvalidArgument, v1::ErrorReason::OFFSET_MISMATCH,
        absl::StrCat("write at offset ", offset, " but the server holds ", committed_, " bytes; resume from there"));
  }
  if (committed_ + static_cast<int64_t>(data.size()) > total_size_) {
    return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::SIZE_EXCEEDED,
                   absl::StrCat("data passes the declared size of ", total_size_, " bytes"));
  }
  int error = 0;
  for (size_t written = 0; written < data.size() && error == 0;) {
    const ssize_t n = ::write(fd_, data.data() + written, data.size() - written);
    if (n > 0) written += static_cast<size_t>(n);
    if (n < 0 && errno != EINTR) error = errno;
  }
  if (error != 0) {
    // Nothing half-written stays behind: the session starts over once there is room.
    finished_ = true;
    Close();
    std::error_code ignored;
    fs::remove(partial_, ignored);
    if (error == ENOSPC || error == EDQUOT) {
      return Failure(absl::StatusCode::kResourceExhausted, v1::ErrorReason::DISK_FULL,
                     "the server's disk is full; the partial upload was discarded");
    }
    return absl::InternalError(absl::StrCat("cannot write upload data: ",
                                            error != 0 ? std::strerror(error) : "the partial file could not be opened"));
  }
  committed_ += static_cast<int64_t>(data.size());
  store_->Reserve(partial_, total_size_ - committed_);  // what is written now counts as stored
  return absl::OkStatus();
}

absl::Status BlobUpload::Finish() {
  finished_ = true;
  if (committed_ != total_size_) {
    return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::SIZE_MISMATCH,
                   absl::StrCat("upload finished after ", committed_, " bytes but declared ", total_size_,
                                "; the partial upload is kept for resuming"));
  }
  absl::StatusOr<std::string> actual = Sha256OfFile(partial_);
  if (!actual.ok()) return actual.status();
  std::error_code error;
  if (*actual != sha256_) {
    fs::remove(partial_, error);
    return Failure(absl::StatusCode::kDataLoss, v1::ErrorReason::CHECKSUM_MISMATCH,
                   absl::StrCat("received data hashes to ", *actual, ", not the declared ", sha256_,
                                "; the upload was discarded"));
  }
  // Durable before it is named: the bytes, then (after the rename) the folder's entry, so a blob a job
  // record names survives a crash whole or not at all.
  if (::fsync(fd_) != 0) {
    const int failure = errno;
    return absl::InternalError(absl::StrCat("cannot flush the upload: ", std::strerror(failure),
                                            "; the partial upload is kept for resuming"));
  }
  // Another session may have published the same bytes meanwhile; replacing them with an identical,
  // verified copy is harmless, and rename is atomic for readers.
  const fs::path blob = store_->PathOf(sha256_);
  fs::rename(partial_, blob, error);
  Close();
  if (error) return absl::InternalError(absl::StrCat("cannot publish blob: ", error.message()));
  return SyncDirectory(blob.parent_path());
}

BlobStore::BlobStore(fs::path root, int64_t max_blob_bytes, int64_t max_stored_bytes)
    : root_(std::move(root)), max_blob_bytes_(max_blob_bytes), max_stored_bytes_(max_stored_bytes) {}

absl::StatusOr<std::unique_ptr<BlobStore>> BlobStore::Open(const fs::path& root, int64_t max_blob_bytes,
                                                           int64_t max_stored_bytes) {
  std::error_code error;
  fs::create_directories(root / "blobs", error);
  if (!error) fs::create_directories(root / "uploads", error);
  if (error) return absl::InternalError(absl::StrCat("cannot create blob folders under ", root.string(), ": ", error.message()));
  return std::unique_ptr<BlobStore>(new BlobStore(root, max_blob_bytes, max_stored_bytes));
}

fs::path BlobStore::PathOf(const std::string& sha256) const { return root_ / "blobs" / sha256; }

fs::path BlobStore::PartialPathOf(const std::string& sha256, const std::string& upload_id) const {
  // The id is hashed so that one session's file name tells nothing about another's id.
  return root_ / "uploads" / absl::StrCat(sha256, ".", Sha256OfBytes(upload_id).substr(0, 32), ".partial");
}

bool BlobStore::Exists(const std::string& sha256) const {
  std::error_code error;
  return IsValidSha256(sha256) && fs::is_regular_file(PathOf(sha256), error);
}

absl::StatusOr<int64_t> BlobStore::SizeOf(const std::string& sha256) const {
  std::error_code error;
  const auto size = fs::file_size(PathOf(sha256), error);
  if (error) {
    return Failure(absl::StatusCode::kNotFound, v1::ErrorReason::BLOB_NOT_FOUND, absl::StrCat("no blob ", sha256));
  }
  return static_cast<int64_t>(size);
}

int64_t BlobStore::CommittedSize(const std::string& sha256, const std::string& upload_id) const {
  if (!IsValidSha256(sha256)) return 0;
  if (Exists(sha256)) {
    absl::StatusOr<int64_t> size = SizeOf(sha256);
    return size.ok() ? *size : 0;
  }
  if (!IsValidUploadId(upload_id)) return 0;
  std::error_code error;
  const auto size = fs::file_size(PartialPathOf(sha256, upload_id), error);
  return error ? 0 : static_cast<int64_t>(size);
}

absl::Status BlobStore::AdmitUpload(const fs::path& partial, int64_t total_size, int64_t committed) {
  // Stored bytes are counted outside the lock (a directory scan); what other sessions may still add
  // is taken under it, together with this session's own reservation.
  const int64_t stored = max_stored_bytes_ > 0 ? StoredBytes() : 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (active_uploads_.count(partial) > 0) {
      return Failure(absl::StatusCode::kAborted, v1::ErrorReason::UPLOAD_IN_PROGRESS,
                     "this upload session is already writing; retry later");
    }
    if (committed > total_size) committed = 0;  // a stale partial of another declared size: started over below
    if (max_stored_bytes_ > 0) {
      int64_t reserved = 0;
      for (const auto& [other, remaining] : active_uploads_) reserved += remaining;
      if (stored + reserved + (total_size - committed) > max_stored_bytes_) {
        return Failure(absl::StatusCode::kResourceExhausted, v1::ErrorReason::QUOTA_EXCEEDED,
                       absl::StrCat("this tenant stores ", stored, " bytes and has ", reserved, " more on the way; ",
                                    total_size - committed, " more would pass its quota of ", max_stored_bytes_,
                                    " bytes (--tenant-max-stored-bytes)"));
      }
    }
    active_uploads_[partial] = total_size - committed;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<BlobUpload>> BlobStore::BeginUpload(const std::string& sha256, int64_t total_size,
                                                                   const std::string& upload_id) {
  if (!IsValidSha256(sha256)) {
    return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::BAD_DIGEST,
                   "sha256 must be 64 lowercase hexadecimal digits");
  }
  if (absl::Status id = CheckUploadId(upload_id); !id.ok()) return id;
  if (total_size < 0) {
    return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::BAD_SIZE, "total_size must be >= 0");
  }
  if (total_size > max_blob_bytes_) {
    return Failure(
        absl::StatusCode::kResourceExhausted, v1::ErrorReason::UPLOAD_TOO_LARGE,
        absl::StrCat(total_size, " bytes is over this server's limit of ", max_blob_bytes_, " bytes per file"));
  }
  const std::string session = upload_id.empty() ? AnonymousUploadId() : upload_id;
  const fs::path partial = PartialPathOf(sha256, session);
  std::error_code error;
  auto held = fs::file_size(partial, error);
  int64_t committed = error ? 0 : static_cast<int64_t>(held);
  if (absl::Status admitted = AdmitUpload(partial, total_size, committed); !admitted.ok()) return admitted;
  // The session's partial, locked for as long as this upload lasts: a replica sharing the folder that
  // resumes the same session meanwhile is refused, as a second writer here is above.
  const int fd = OpenLocked(partial, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC);
  if (fd < 0) {
    const int failure = errno;
    EndUpload(partial);
    if (failure == EWOULDBLOCK) {
      return Failure(absl::StatusCode::kAborted, v1::ErrorReason::UPLOAD_IN_PROGRESS,
                     "this upload session is writing on another replica; retry later");
    }
    return absl::InternalError(absl::StrCat("cannot open the partial upload: ", std::strerror(failure)));
  }
  // What the file holds now that it is ours (another replica may have added to it since it was sized).
  struct stat info {};
  committed = ::fstat(fd, &info) == 0 ? static_cast<int64_t>(info.st_size) : 0;
  if (committed > total_size) committed = 0;  // a stale partial of another declared size: started over
  if (committed == 0 && ::ftruncate(fd, 0) != 0) {
    ::close(fd);
    EndUpload(partial);
    return absl::InternalError(absl::StrCat("cannot reset the partial upload: ", std::strerror(errno)));
  }
  Reserve(partial, total_size - committed);
  return std::unique_ptr<BlobUpload>(new BlobUpload(this, sha256, partial, fd, total_size, committed));
}

int64_t BlobStore::StoredBytes() const {
  int64_t total = 0;
  for (const char* folder : {"blobs", "uploads"}) {
    std::error_code error;
    for (const auto& entry : fs::directory_iterator(root_ / folder, error)) {
      std::error_code ignored;
      const auto size = entry.file_size(ignored);
      if (!ignored) total += static_cast<int64_t>(size);
    }
  }
  return total;
}

int BlobStore::ExpireStaleUploads(std::chrono::seconds max_age) {
  const auto cutoff = fs::file_time_type::clock::now() - max_age;
  int removed = 0;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(root_ / "uploads", error)) {
    if (!absl::EndsWith(entry.path().filename().string(), ".partial")) continue;
    std::lock_guard<std::mutex> lock(mutex_);
    if (active_uploads_.count(entry.path()) > 0) continue;
    std::error_code ignored;
    const auto written = fs::last_write_time(entry.path(), ignored);
    if (ignored || written >= cutoff) continue;
    // Not while a replica sharing the folder holds it.
    const int fd = OpenLocked(entry.path(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    if (fs::remove(entry.path(), ignored)) ++removed;
    ::close(fd);
  }
  return removed;
}

void BlobStore::Touch(const std::string& sha256) {
  std::error_code ignored;
  if (Exists(sha256)) fs::last_write_time(PathOf(sha256), fs::file_time_type::clock::now(), ignored);
}

int64_t BlobStore::Remove(const std::string& sha256) {
  if (!Exists(sha256)) return 0;
  std::error_code error;
  const auto size = fs::file_size(PathOf(sha256), error);
  if (!fs::remove(PathOf(sha256), error) || error) return 0;
  return static_cast<int64_t>(size);
}

std::vector<std::string> BlobStore::BlobsOlderThan(std::chrono::seconds age) const {
  const auto cutoff = fs::file_time_type::clock::now() - age;
  std::vector<std::string> old;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(root_ / "blobs", error)) {
    const std::string name = entry.path().filename().string();
    std::error_code ignored;
    const auto written = fs::last_write_time(entry.path(), ignored);
    if (IsValidSha256(name) && !ignored && written < cutoff) old.push_back(name);
  }
  return old;
}

bool BlobStore::RemoveIfCorrupt(const std::string& sha256) {
  if (!Exists(sha256)) return false;
  absl::StatusOr<std::string> actual = Sha256OfFile(PathOf(sha256));
  if (!actual.ok() || *actual == sha256) return false;
  std::error_code ignored;
  return fs::remove(PathOf(sha256), ignored);
}

void BlobStore::Reserve(const fs::path& partial, int64_t remaining) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = active_uploads_.find(partial);
  if (it != active_uploads_.end()) it->second = remaining;
}

void BlobStore::EndUpload(const fs::path& partial) {
  std::lock_guard<std::mutex> lock(mutex_);
  active_uploads_.erase(partial);
}

}  // namespace onnxopt::server
