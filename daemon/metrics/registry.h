// A small Prometheus metrics registry: families of counters, gauges and histograms with a
// fixed set of label names, gauges and counters computed at scrape time by callbacks, and
// serialization to the text exposition format 0.0.4 (see text_format.h).
//
// Typical use: register families once at startup, resolve the label sets a hot path needs
// once, and keep the references:
//
//   Registry registry;
//   absl::StatusOr<CounterFamily*> evictions = registry.AddCounter(
//       "kvarn_evictions_total", "Blocks evicted, by reason.", {"reason"});
//   Counter& pressure = (*evictions)->WithLabels({"pressure"});
//   ...
//   pressure.Increment();                  // lock-free
//   std::string text = registry.Serialize();  // on the scrape thread
//
// Ownership: the Registry owns every family and every series; pointers and references it
// hands out stay valid until it is destroyed. Series are never removed (only callbacks are),
// so label values must come from a bounded set.
//
// Thread safety: all methods of all classes here may be called concurrently. Updates to a
// series are lock-free; registration, WithLabels and Serialize take mutexes, never two at
// once (Serialize takes each family's in turn, after releasing the registry's).
#ifndef KVARN_DAEMON_METRICS_REGISTRY_H_
#define KVARN_DAEMON_METRICS_REGISTRY_H_

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/mutex.h"
#include "absl/types/span.h"
#include "daemon/metrics/metric.h"

namespace kvarn::metrics {

enum class MetricType { kCounter, kGauge, kHistogram };

class Registry;

namespace internal {

// Orders label-value tuples lexicographically whatever their element string type, so a
// lookup by a span of string_views needs no copies. Series print in this order.
struct LabelValuesLess {
  using is_transparent = void;
  template <typename A, typename B>
  bool operator()(const A& a, const B& b) const {
    return std::lexicographical_compare(
        a.begin(), a.end(), b.begin(), b.end(),
        [](absl::string_view x, absl::string_view y) { return x < y; });
  }
};

template <typename V>
using SeriesMap = std::map<std::vector<std::string>, V, LabelValuesLess>;

// What every family shares: identity, label names, and its part of the exposition.
class FamilyBase {
 public:
  FamilyBase(const FamilyBase&) = delete;
  FamilyBase& operator=(const FamilyBase&) = delete;
  virtual ~FamilyBase() = default;

  const std::string& name() const { return name_; }
  const std::string& help() const { return help_; }
  MetricType type() const { return type_; }
  // True for families whose values come from callbacks at scrape time.
  bool is_callback() const { return is_callback_; }
  const std::vector<std::string>& label_names() const { return label_names_; }
  // Histograms only: the finite upper bounds, strictly increasing (+Inf is implicit).
  const std::vector<double>& bucket_bounds() const { return bucket_bounds_; }

  // Appends the "# HELP" and "# TYPE" lines and every sample, series in label-value order.
  // Appends nothing when the family has no series yet.
  virtual void AppendText(std::string* out) const = 0;

 protected:
  FamilyBase(MetricType type, bool is_callback, std::string name, std::string help,
             std::vector<std::string> label_names, std::vector<double> bucket_bounds);

  // INVALID_ARGUMENT unless `values` has one valid-UTF-8 value per label name.
  absl::Status CheckLabelValues(absl::Span<const absl::string_view> values) const;
  void AppendHeader(std::string* out) const;

 private:
  const MetricType type_;
  const bool is_callback_;
  const std::string name_;
  const std::string help_;
  const std::vector<std::string> label_names_;
  const std::vector<double> bucket_bounds_;
};

}  // namespace internal

// A family of series of one type T (Counter, Gauge or Histogram) sharing a name, help text
// and label names; one series per distinct tuple of label values.
template <typename T>
class Family final : public internal::FamilyBase {
 public:
  // Returns the series for `values` (one per label name, in label_names() order), creating
  // it at zero on first use. The reference stays valid for the Registry's lifetime; the
  // lookup takes the family's mutex, so hot paths resolve it once and keep it.
  // A value that is not valid UTF-8 is stored with U+FFFD in place of the bad bytes.
  // REQUIRES: values.size() == label_names().size(). The arity is fixed where the call is
  // written, so a mismatch is a programming error and aborts with a message naming the
  // family; TryWithLabels reports it as a status instead.
  T& WithLabels(absl::Span<const absl::string_view> values);

  // As WithLabels, but INVALID_ARGUMENT (and no series created) for a wrong number of values
  // or a value that is not valid UTF-8. For label values that come from outside.
  absl::StatusOr<T*> TryWithLabels(absl::Span<const absl::string_view> values);

  void AppendText(std::string* out) const override;

 private:
  friend class Registry;
  Family(MetricType type, std::string name, std::string help, std::vector<std::string> label_names,
         std::vector<double> bucket_bounds)
      : FamilyBase(type, /*is_callback=*/false, std::move(name), std::move(help),
                   std::move(label_names), std::move(bucket_bounds)) {}

  T& FindOrCreate(absl::Span<const absl::string_view> values) ABSL_LOCKS_EXCLUDED(mu_);

  mutable Mutex mu_;
  internal::SeriesMap<std::unique_ptr<T>> series_ ABSL_GUARDED_BY(mu_);
};

using CounterFamily = Family<Counter>;
using GaugeFamily = Family<Gauge>;
using HistogramFamily = Family<Histogram>;

extern template class Family<Counter>;
extern template class Family<Gauge>;
extern template class Family<Histogram>;

// A gauge or counter family whose values are computed when scraped, e.g. pool capacity
// read from the pool itself, so the number can never drift from the source of truth.
class CallbackFamily final : public internal::FamilyBase {
 public:
  // Called on the scraping thread with this family's mutex held, once per scrape. It must
  // be thread-safe and quick, must not call into this family, and for a counter family must
  // never decrease. Because of that mutex, do not call SetCallback or RemoveCallback while
  // holding a lock the callback itself takes: a concurrent scrape would deadlock.
  using Callback = std::function<double()>;

  // Installs `callback` as the source of the series for `values`, replacing any previous
  // one. INVALID_ARGUMENT for a wrong number of values, a value that is not valid UTF-8,
  // or an empty callback.
  absl::Status SetCallback(absl::Span<const absl::string_view> values, Callback callback);

  // Removes the series for `values`. Once this returns, its callback is not running and
  // never runs again, so whatever it captured may be destroyed. NOT_FOUND if none is set.
  absl::Status RemoveCallback(absl::Span<const absl::string_view> values);

  void AppendText(std::string* out) const override;

 private:
  friend class Registry;
  CallbackFamily(MetricType type, std::string name, std::string help,
                 std::vector<std::string> label_names)
      : FamilyBase(type, /*is_callback=*/true, std::move(name), std::move(help),
                   std::move(label_names), {}) {}

  mutable Mutex mu_;
  internal::SeriesMap<Callback> callbacks_ ABSL_GUARDED_BY(mu_);
};

// Owns every family; serializes them in name order.
//
// The Add* methods validate before registering anything:
//  - INVALID_ARGUMENT: a metric or label name breaking the Prometheus rules (text_format.h),
//    a duplicate label name, "le" as a histogram label, empty or non-UTF-8 help text, bad
//    bucket bounds (not strictly increasing, NaN, or infinite other than a trailing +Inf,
//    which is dropped since the +Inf bucket always exists).
//  - ALREADY_EXISTS: the name is registered as another type, or as the same type with
//    different help, label names or buckets; or one of its sample names collides with
//    another family's (a histogram "x" emits x_bucket, x_sum and x_count).
// Registering the very same family again returns the existing one, so components may
// register what they use without coordinating. A family without labels has its one series
// from registration on, so it reads 0 rather than being absent before the first update.
class Registry {
 public:
  Registry() = default;
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;
  ~Registry() = default;

  absl::StatusOr<CounterFamily*> AddCounter(absl::string_view name, absl::string_view help,
                                            std::vector<std::string> label_names = {});
  absl::StatusOr<GaugeFamily*> AddGauge(absl::string_view name, absl::string_view help,
                                        std::vector<std::string> label_names = {});
  absl::StatusOr<HistogramFamily*> AddHistogram(absl::string_view name, absl::string_view help,
                                                std::vector<double> bucket_bounds,
                                                std::vector<std::string> label_names = {});
  absl::StatusOr<CallbackFamily*> AddCallbackGauge(absl::string_view name, absl::string_view help,
                                                   std::vector<std::string> label_names = {});
  absl::StatusOr<CallbackFamily*> AddCallbackCounter(absl::string_view name, absl::string_view help,
                                                     std::vector<std::string> label_names = {});

  // The whole registry in the text exposition format 0.0.4: families in name order, series
  // in label-value order, so equal states give byte-identical output.
  std::string Serialize() const;
  void SerializeTo(std::string* out) const;

 private:
  struct Spec {
    MetricType type;
    bool is_callback;
    absl::string_view name;
    absl::string_view help;
    std::vector<std::string> label_names;
    std::vector<double> bucket_bounds;  // histograms only
  };
  // Validates `spec`, then returns the existing identical family or a new one built from it.
  // The result's dynamic type matches spec.type and spec.is_callback.
  absl::StatusOr<internal::FamilyBase*> Add(Spec spec) ABSL_LOCKS_EXCLUDED(mu_);

  mutable Mutex mu_;
  std::map<std::string, std::unique_ptr<internal::FamilyBase>, std::less<>> families_
      ABSL_GUARDED_BY(mu_);
  // Every sample name any family emits, mapped to that family's name.
  std::map<std::string, std::string, std::less<>> sample_names_ ABSL_GUARDED_BY(mu_);
};

// `count` bounds start, start*factor, start*factor^2, ...
// INVALID_ARGUMENT unless start > 0, factor > 1 and count >= 1.
absl::StatusOr<std::vector<double>> ExponentialBuckets(double start, double factor, int count);

// `count` bounds start, start+width, start+2*width, ...
// INVALID_ARGUMENT unless width > 0 and count >= 1 (and all finite).
absl::StatusOr<std::vector<double>> LinearBuckets(double start, double width, int count);

}  // namespace kvarn::metrics

#endif  // KVARN_DAEMON_METRICS_REGISTRY_H_
