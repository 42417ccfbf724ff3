#include "server/job_queue.h"

namespace onnxopt::server {

bool JobQueue::Push(const std::string& name, int priority, bool force) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_ || (!force && items_.size() >= capacity_)) return false;
    items_.emplace(-priority, next_sequence_++, name);
  }
  available_.notify_one();
  return true;
}

std::optional<std::string> JobQueue::Pop() {
  std::unique_lock<std::mutex> lock(mutex_);
  available_.wait(lock, [&] { return closed_ || !items_.empty(); });
  if (closed_) return std::nullopt;
  std::string name = std::get<2>(*items_.begin());
  items_.erase(items_.begin());
  return name;
}

bool JobQueue::Remove(const std::string& name) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = items_.begin(); it != items_.end(); ++it) {
    if (std::get<2>(*it) == name) {
      items_.erase(it);
      return true;
    }
  }
  return false;
}

void JobQueue::Close() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    closed_ = true;
  }
  available_.notify_all();
}

size_t JobQueue::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return items_.size();
}

}  // namespace onnxopt::server
