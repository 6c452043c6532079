// A one-line progress bar for long CLI work, redrawn in place with '\r' on a terminal.
// It writes only to the stream it is given (kvarnctl passes stderr, never stdout) and
// draws nothing when disabled, so callers report progress unconditionally.
#ifndef KVARN_CLIENT_KVARNCTL_PROGRESS_H_
#define KVARN_CLIENT_KVARNCTL_PROGRESS_H_

#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>

namespace kvarn::ctl {

class ProgressBar {
 public:
  // `total` units of work (e.g. tiles); `enabled` false makes every call a no-op.
  ProgressBar(std::ostream& out, int64_t total, bool enabled)
      : out_(out), total_(total > 0 ? total : 1), enabled_(enabled) {}
  ~ProgressBar() { Finish(); }
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  // Adds `units` of finished work; `label` says what is running. Redraws only when the
  // percentage or the label changes.
  void Advance(int64_t units, std::string_view label);
  // Clears the line. Idempotent.
  void Finish();

  bool enabled() const { return enabled_; }
  int64_t done() const { return done_; }
  // The line as last drawn, without '\r' (for tests).
  const std::string& last_line() const { return last_line_; }

 private:
  std::ostream& out_;
  int64_t total_;
  int64_t done_ = 0;
  int last_percent_ = -1;
  std::string last_label_;
  std::string last_line_;
  size_t drawn_width_ = 0;
  bool enabled_;
  bool drawn_ = false;
};

}  // namespace kvarn::ctl

#endif  // KVARN_CLIENT_KVARNCTL_PROGRESS_H_
