#include "tests/bench/summary.h"

#include <algorithm>
#include <cstdarg>
#include <cstdio>

namespace kvarn::bench {
namespace {

std::optional<double> Median(const std::map<std::string, std::vector<double>>& m,
                             const std::string& name) {
  const auto it = m.find(name);
  if (it == m.end() || it->second.empty()) return std::nullopt;
  std::vector<double> v = it->second;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

void SummaryReporter::ReportRuns(const std::vector<Run>& runs) {
  ConsoleReporter::ReportRuns(runs);
  for (const Run& run : runs) {
    if (run.error_occurred || run.iterations == 0) continue;
    const bool median = run.run_type == Run::RT_Aggregate && run.aggregate_name == "median";
    if (run.run_type != Run::RT_Iteration && !median) continue;
    const std::string name = run.run_name.function_name;  // as registered, without suffixes
    // An aggregate's accumulated time is the statistic of the repetitions' accumulated times.
    // CPU time, the clock Google Benchmark's rate counters (bytes_per_second) use too.
    (median ? median_seconds_ : seconds_)[name].push_back(run.cpu_accumulated_time /
                                                          static_cast<double>(run.iterations));
    for (const auto& [counter, value] : run.counters) {
      (median ? median_counters_ : counters_)[name + "/" + counter].push_back(value.value);
    }
  }
}

std::optional<double> SummaryReporter::BytesPerSecond(const std::string& name) const {
  return Counter(name, "bytes_per_second");
}
std::optional<double> SummaryReporter::Counter(const std::string& name,
                                               const std::string& counter) const {
  const auto m = Median(counters_, name + "/" + counter);
  return m ? m : Median(median_counters_, name + "/" + counter);
}
std::optional<double> SummaryReporter::SecondsPerIteration(const std::string& name) const {
  const auto m = Median(seconds_, name);
  return m ? m : Median(median_seconds_, name);
}

std::string TextTable::Render() const {
  std::vector<size_t> width;
  for (const auto& row : rows_) {
    if (row.size() > width.size()) width.resize(row.size(), 0);
    for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  }
  size_t total = 0;
  for (size_t w : width) total += w + 2;
  std::string out;
  for (const auto& row : rows_) {
    if (row.empty()) {
      out += std::string(total, '-') + "\n";
      continue;
    }
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line += std::string(width[i] - row[i].size() + 2, ' ');
    }
    out += line + "\n";
  }
  return out;
}

std::string Format(const char* fmt, ...) {
  char buf[512];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(buf, sizeof(buf), fmt, args);
  va_end(args);
  return buf;
}

}  // namespace kvarn::bench
