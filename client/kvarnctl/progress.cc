#include "client/kvarnctl/progress.h"

#include <algorithm>

namespace kvarn::ctl {
namespace {
constexpr int kBarWidth = 30;
}  // namespace

void ProgressBar::Advance(int64_t units, std::string_view label) {
  if (!enabled_) return;
  done_ = std::min(done_ + units, total_);
  const int percent = static_cast<int>(100 * done_ / total_);
  if (percent == last_percent_ && label == last_label_) return;
  last_percent_ = percent;
  last_label_ = std::string(label);
  const int filled = static_cast<int>(kBarWidth * done_ / total_);
  std::string line = "[";
  line.append(filled, '#');
  line.append(kBarWidth - filled, '.');
  line += "] ";
  const std::string pct = std::to_string(percent);
  line.append(3 - std::min<size_t>(3, pct.size()), ' ');
  line += pct + "%  " + last_label_;
  // Pad over the remains of a longer previous line.
  const size_t width = std::max(line.size(), drawn_width_);
  last_line_ = line;
  line.append(width - line.size(), ' ');
  drawn_width_ = width;
  out_ << '\r' << line << std::flush;
  drawn_ = true;
}

void ProgressBar::Finish() {
  if (!enabled_ || !drawn_) return;
  out_ << '\r' << std::string(drawn_width_, ' ') << '\r' << std::flush;
  drawn_ = false;
}

}  // namespace kvarn::ctl
