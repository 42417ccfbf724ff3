// A bounded priority queue of job names: higher priority first, FIFO within a priority.
#ifndef ONNXOPT_SERVER_JOB_QUEUE_H_
#define ONNXOPT_SERVER_JOB_QUEUE_H_

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <tuple>

namespace onnxopt::server {

class JobQueue {
 public:
  explicit JobQueue(size_t capacity) : capacity_(capacity) {}

  // False if the queue is full or closed. `force` ignores the capacity (re-queueing after a restart).
  bool Push(const std::string& name, int priority, bool force = false);
  // Blocks for the next job; nullopt once the queue is closed (jobs still in it stay unpopped).
  std::optional<std::string> Pop();
  // Takes a queued job out (cancel); false if it is not queued.
  bool Remove(const std::string& name);
  void Close();
  size_t size() const;
  size_t capacity() const { return capacity_; }

 private:
  using Item = std::tuple<int, uint64_t, std::string>;  // (-priority, sequence, name)
  const size_t capacity_;
  mutable std::mutex mutex_;
  std::condition_variable available_;
  std::set<Item> items_;
  uint64_t next_sequence_ = 0;
  bool closed_ = false;
};

}  // namespace onnxopt::server

#endif  // ONNXOPT_SERVER_JOB_QUEUE_H_
