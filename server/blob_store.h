// Content-addressed blobs on disk: blobs/<sha256>, written through a partial file under uploads/ and
// renamed into place only after the size and SHA-256 check, so a blob that exists is whole and
// verified. Partial uploads survive restarts, which is what makes uploads resumable.
//
// Each upload session writes a partial of its own, named by the blob's hash and the session's upload
// id, so no other client can add bytes to it or hold it: a stranger who writes garbage under a real
// file's hash, or keeps an upload of it open, only spoils their own session. Partials nobody touched
// for the expiry age are deleted.
//
// Replicas may share the folder (a ReadWriteMany volume): a session's partial is locked (flock) while
// one replica writes it, so a resumed upload continues on any replica but never on two at once, and
// blobs appear by rename only, so no replica ever reads half a blob.
#ifndef ONNXOPT_SERVER_BLOB_STORE_H_
#define ONNXOPT_SERVER_BLOB_STORE_H_

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "optimizer/sha256.h"

namespace onnxopt::server {

using ::onnxopt::IsValidSha256;
using ::onnxopt::Sha256OfFile;

class BlobStore;

// One upload in progress. At most one per session at a time; destroying it keeps the partial data.
class BlobUpload {
 public:
  ~BlobUpload();
  int64_t committed_size() const { return committed_; }
  // INVALID_ARGUMENT (OFFSET_MISMATCH) unless offset == committed_size(); INVALID_ARGUMENT if the data
  // would pass the declared size.
  absl::Status Append(int64_t offset, const std::string& data);
  // Verifies size and hash and publishes the blob. DATA_LOSS (CHECKSUM_MISMATCH) discards the upload.
  absl::Status Finish();

 private:
  friend class BlobStore;
  // `fd`: the partial, open for appending and locked.
  BlobUpload(BlobStore* store, std::string sha256, std::filesystem::path partial, int fd, int64_t total_size,
             int64_t committed);
  void Close();
  BlobStore* store_;
  std::string sha256_;
  std::filesystem::path partial_;
  int fd_;
  int64_t total_size_;
  int64_t committed_;
  bool finished_ = false;
};

class BlobStore {
 public:
  // `max_stored_bytes` > 0: the most the store may hold, blobs and partial uploads together (a
  // tenant's quota), checked when an upload starts.
  static absl::StatusOr<std::unique_ptr<BlobStore>> Open(const std::filesystem::path& root, int64_t max_blob_bytes,
                                                         int64_t max_stored_bytes = 0);

  bool Exists(const std::string& sha256) const;
  std::filesystem::path PathOf(const std::string& sha256) const;
  absl::StatusOr<int64_t> SizeOf(const std::string& sha256) const;
  // Bytes the session `upload_id` holds of an interrupted upload (0 if none); the full size if the blob
  // exists.
  int64_t CommittedSize(const std::string& sha256, const std::string& upload_id) const;
  // Starts or resumes the session `upload_id` (chosen by the client; empty: a fresh session that cannot
  // be resumed). INVALID_ARGUMENT for a malformed digest or id, RESOURCE_EXHAUSTED (UPLOAD_TOO_LARGE)
  // over the size limit or (QUOTA_EXCEEDED) past max_stored_bytes, ABORTED (UPLOAD_IN_PROGRESS) if the
  // same session is already uploading, here or on another replica.
  absl::StatusOr<std::unique_ptr<BlobUpload>> BeginUpload(const std::string& sha256, int64_t total_size,
                                                          const std::string& upload_id);
  // Deletes partial uploads that no session is writing and nobody wrote to for `max_age`; returns how many.
  int ExpireStaleUploads(std::chrono::seconds max_age);
  // Marks a blob as just used (an upload found it already there), so garbage collection of unused
  // blobs gives the job it is uploaded for its full grace time.
  void Touch(const std::string& sha256);
  // Deletes a blob; the bytes freed (0 if there was none).
  int64_t Remove(const std::string& sha256);
  // The blobs nobody wrote for `age` or longer.
  std::vector<std::string> BlobsOlderThan(std::chrono::seconds age) const;
  // Re-hashes a stored blob and deletes it if its content no longer matches its name; true if deleted.
  bool RemoveIfCorrupt(const std::string& sha256);
  int64_t max_blob_bytes() const { return max_blob_bytes_; }
  int64_t max_stored_bytes() const { return max_stored_bytes_; }
  // Bytes held: blobs plus partial uploads.
  int64_t StoredBytes() const;

 private:
  friend class BlobUpload;
  BlobStore(std::filesystem::path root, int64_t max_blob_bytes, int64_t max_stored_bytes);
  std::filesystem::path PartialPathOf(const std::string& sha256, const std::string& upload_id) const;
  void EndUpload(const std::filesystem::path& partial);
  // Registers the upload session `partial` (its `committed` bytes already there) as writing, within the
  // tenant's quota of stored bytes; ABORTED when the session is already writing here.
  absl::Status AdmitUpload(const std::filesystem::path& partial, int64_t total_size, int64_t committed);
  void Reserve(const std::filesystem::path& partial, int64_t remaining);

  std::filesystem::path root_;
  int64_t max_blob_bytes_;
  int64_t max_stored_bytes_;
  mutable std::mutex mutex_;
  // Partials being written, with the bytes each may still add (counted against max_stored_bytes, so
  // that concurrent sessions cannot pass the quota together).
  std::map<std::filesystem::path, int64_t> active_uploads_;
};

// Upload ids: 1 to 128 characters of [A-Za-z0-9_-].
bool IsValidUploadId(const std::string& upload_id);
// OK for an empty (anonymous) or valid id; INVALID_ARGUMENT (BAD_UPLOAD_ID) otherwise.
absl::Status CheckUploadId(const std::string& upload_id);

}  // namespace onnxopt::server

#endif  // ONNXOPT_SERVER_BLOB_STORE_H_
