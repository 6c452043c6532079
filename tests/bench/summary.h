// The closing summary of kvarn_codec_bench: a reporter that keeps Google Benchmark's console
// output and records each benchmark's figures, and a plain-text table that prints every
// figure beside its reference and target.
#ifndef KVARN_TESTS_BENCH_SUMMARY_H_
#define KVARN_TESTS_BENCH_SUMMARY_H_

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"

namespace kvarn::bench {

class SummaryReporter : public benchmark::ConsoleReporter {
 public:
  using ConsoleReporter::ConsoleReporter;
  void ReportRuns(const std::vector<Run>& runs) override;

  // Median over the repetitions of a benchmark, by its name as registered: computed here from
  // the repetitions, or Google Benchmark's median aggregate when only aggregates are reported.
  // nullopt when it did not run (filtered out, or it failed).
  std::optional<double> BytesPerSecond(const std::string& name) const;
  // CPU seconds per iteration: the same clock as BytesPerSecond.
  std::optional<double> SecondsPerIteration(const std::string& name) const;
  // A user counter of a benchmark, median over repetitions.
  std::optional<double> Counter(const std::string& name, const std::string& counter) const;

 private:
  // By benchmark name (counters: name + "/" + counter): one value per repetition, or the one
  // median aggregate.
  std::map<std::string, std::vector<double>> seconds_, counters_;
  std::map<std::string, std::vector<double>> median_seconds_, median_counters_;
};

// A table of left-aligned text columns; the first row added is the header.
class TextTable {
 public:
  void AddRow(std::vector<std::string> cells) { rows_.push_back(std::move(cells)); }
  void AddSeparator() { rows_.push_back({}); }
  std::string Render() const;

 private:
  std::vector<std::vector<std::string>> rows_;
};

// printf into a std::string.
std::string Format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

}  // namespace kvarn::bench

#endif  // KVARN_TESTS_BENCH_SUMMARY_H_
