// A status line that rewrites itself on a terminal and prints one line per change otherwise.
#ifndef ONNXOPT_CLIENT_COMMANDS_PROGRESS_LINE_H_
#define ONNXOPT_CLIENT_COMMANDS_PROGRESS_LINE_H_

#include <unistd.h>

#include <iostream>
#include <string>

namespace onnxopt::cli {

class ProgressLine {
 public:
  ProgressLine() : tty_(isatty(STDERR_FILENO)) {}
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;
  ~ProgressLine() { Done(); }

  void Show(const std::string& text) {
    if (text == last_) return;
    last_ = text;
    if (tty_) {
      std::cerr << "\r\033[K" << text << std::flush;
      open_ = true;
    } else {
      std::cerr << text << std::endl;
    }
  }
  // Ends the line (on a terminal) so that what follows starts on its own.
  void Done() {
    if (open_) std::cerr << std::endl;
    open_ = false;
  }

 private:
  bool tty_;
  bool open_ = false;
  std::string last_;
};

}  // namespace onnxopt::cli

#endif  // ONNXOPT_CLIENT_COMMANDS_PROGRESS_LINE_H_
