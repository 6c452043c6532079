#include "daemon/metrics/registry.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/metrics/text_format.h"

namespace kvarn::metrics {
namespace {

absl::string_view TypeName(MetricType type) {
  switch (type) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kGauge:
      return "gauge";
    case MetricType::kHistogram:
      return "histogram";
  }
  return "untyped";
}

std::string KindName(MetricType type, bool is_callback) {
  return absl::StrCat(is_callback ? "callback " : "", TypeName(type));
}

// The names of the samples a family emits; two families must not share any.
std::vector<std::string> SampleNames(MetricType type, absl::string_view name) {
  if (type == MetricType::kHistogram) {
    return {std::string(name), absl::StrCat(name, "_bucket"), absl::StrCat(name, "_sum"),
            absl::StrCat(name, "_count")};
  }
  return {std::string(name)};
}

// One sample line: name[suffix]{l1="v1",...[,le="bound"]} value
void AppendSample(absl::string_view name, absl::string_view suffix,
                  const std::vector<std::string>& label_names,
                  const std::vector<std::string>& label_values, absl::string_view le,
                  absl::string_view value, std::string* out) {
  absl::StrAppend(out, name, suffix);
  if (!label_names.empty() || !le.empty()) {
    out->push_back('{');
    for (size_t i = 0; i < label_names.size(); ++i) {
      if (i > 0) out->push_back(',');
      absl::StrAppend(out, label_names[i], "=\"");
      AppendEscapedLabelValue(label_values[i], out);
      out->push_back('"');
    }
    if (!le.empty()) {
      absl::StrAppend(out, label_names.empty() ? "" : ",", "le=\"", le, "\"");
    }
    out->push_back('}');
  }
  absl::StrAppend(out, " ", value, "\n");
}

void AppendSeries(const internal::FamilyBase& family, const std::vector<std::string>& values,
                  const Counter& counter, std::string* out) {
  AppendSample(family.name(), "", family.label_names(), values, "", FormatDouble(counter.Value()),
               out);
}

void AppendSeries(const internal::FamilyBase& family, const std::vector<std::string>& values,
                  const Gauge& gauge, std::string* out) {
  AppendSample(family.name(), "", family.label_names(), values, "", FormatDouble(gauge.Value()),
               out);
}

void AppendSeries(const internal::FamilyBase& family, const std::vector<std::string>& values,
                  const Histogram& histogram, std::string* out) {
  const Histogram::Snapshot snapshot = histogram.Take();
  const std::vector<double>& bounds = family.bucket_bounds();
  for (size_t i = 0; i < bounds.size(); ++i) {
    AppendSample(family.name(), "_bucket", family.label_names(), values,
                 FormatBucketBound(bounds[i]), absl::StrCat(snapshot.cumulative_counts[i]), out);
  }
  AppendSample(family.name(), "_bucket", family.label_names(), values, "+Inf",
               absl::StrCat(snapshot.count), out);
  AppendSample(family.name(), "_sum", family.label_names(), values, "", FormatDouble(snapshot.sum),
               out);
  AppendSample(family.name(), "_count", family.label_names(), values, "",
               absl::StrCat(snapshot.count), out);
}

[[noreturn]] void DieOnArityMismatch(const internal::FamilyBase& family, size_t got) {
  std::fprintf(stderr, "kvarn::metrics: %s.WithLabels got %zu label values for labels {%s}\n",
               family.name().c_str(), got, absl::StrJoin(family.label_names(), ",").c_str());
  std::abort();
}

std::vector<std::string> ToKey(absl::Span<const absl::string_view> values) {
  std::vector<std::string> key;
  key.reserve(values.size());
  for (const absl::string_view v : values) key.emplace_back(v.data(), v.size());
  return key;
}

absl::Status ValidateBounds(std::vector<double>& bounds) {
  if (!bounds.empty() && bounds.back() == INFINITY) bounds.pop_back();
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (!std::isfinite(bounds[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat("bucket bound ", FormatDouble(bounds[i]), " is not finite"));
    }
    if (i > 0 && !(bounds[i - 1] < bounds[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat("bucket bounds must strictly increase: ", FormatDouble(bounds[i - 1]),
                       " then ", FormatDouble(bounds[i])));
    }
  }
  return absl::OkStatus();
}

}  // namespace

namespace internal {

FamilyBase::FamilyBase(MetricType type, bool is_callback, std::string name, std::string help,
                       std::vector<std::string> label_names, std::vector<double> bucket_bounds)
    : type_(type),
      is_callback_(is_callback),
      name_(std::move(name)),
      help_(std::move(help)),
      label_names_(std::move(label_names)),
      bucket_bounds_(std::move(bucket_bounds)) {}

absl::Status FamilyBase::CheckLabelValues(absl::Span<const absl::string_view> values) const {
  if (values.size() != label_names_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(name_, " has labels {",
                                                   absl::StrJoin(label_names_, ","), "} but got ",
                                                   values.size(), " values"));
  }
  for (size_t i = 0; i < values.size(); ++i) {
    if (!IsValidUtf8(values[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat(name_, ": value of label ", label_names_[i], " is not valid UTF-8"));
    }
  }
  return absl::OkStatus();
}

void FamilyBase::AppendHeader(std::string* out) const {
  absl::StrAppend(out, "# HELP ", name_, " ");
  AppendEscapedHelp(help_, out);
  absl::StrAppend(out, "\n# TYPE ", name_, " ", TypeName(type_), "\n");
}

}  // namespace internal

template <typename T>
T& Family<T>::WithLabels(absl::Span<const absl::string_view> values) {
  if (values.size() != label_names().size()) DieOnArityMismatch(*this, values.size());
  for (const absl::string_view v : values) {
    if (IsValidUtf8(v)) continue;
    std::vector<std::string> sanitized;
    for (const absl::string_view w : values) sanitized.push_back(SanitizeUtf8(w));
    const std::vector<absl::string_view> views(sanitized.begin(), sanitized.end());
    return FindOrCreate(views);
  }
  return FindOrCreate(values);
}

template <typename T>
absl::StatusOr<T*> Family<T>::TryWithLabels(absl::Span<const absl::string_view> values) {
  if (absl::Status status = CheckLabelValues(values); !status.ok()) return status;
  return &FindOrCreate(values);
}

template <typename T>
T& Family<T>::FindOrCreate(absl::Span<const absl::string_view> values) {
  MutexLock lock(&mu_);
  auto it = series_.find(values);
  if (it == series_.end()) {
    std::unique_ptr<T> series;
    if constexpr (std::is_same_v<T, Histogram>) {
      series.reset(new Histogram(bucket_bounds()));
    } else {
      series.reset(new T());
    }
    it = series_.emplace(ToKey(values), std::move(series)).first;
  }
  return *it->second;
}

template <typename T>
void Family<T>::AppendText(std::string* out) const {
  MutexLock lock(&mu_);
  if (series_.empty()) return;
  AppendHeader(out);
  for (const auto& [values, series] : series_) AppendSeries(*this, values, *series, out);
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<Histogram>;

absl::Status CallbackFamily::SetCallback(absl::Span<const absl::string_view> values,
                                         Callback callback) {
  if (absl::Status status = CheckLabelValues(values); !status.ok()) return status;
  if (!callback) return absl::InvalidArgumentError(absl::StrCat(name(), ": empty callback"));
  MutexLock lock(&mu_);
  auto it = callbacks_.find(values);
  if (it == callbacks_.end()) {
    callbacks_.emplace(ToKey(values), std::move(callback));
  } else {
    it->second = std::move(callback);
  }
  return absl::OkStatus();
}

absl::Status CallbackFamily::RemoveCallback(absl::Span<const absl::string_view> values) {
  MutexLock lock(&mu_);
  auto it = callbacks_.find(values);
  if (it == callbacks_.end()) {
    return absl::NotFoundError(
        absl::StrCat(name(), ": no callback for {", absl::StrJoin(values, ","), "}"));
  }
  callbacks_.erase(it);
  return absl::OkStatus();
}

void CallbackFamily::AppendText(std::string* out) const {
  // The lock stays held across the callbacks: that is what lets RemoveCallback promise the
  // callback is no longer running.
  MutexLock lock(&mu_);
  if (callbacks_.empty()) return;
  AppendHeader(out);
  for (const auto& [values, callback] : callbacks_) {
    AppendSample(name(), "", label_names(), values, "", FormatDouble(callback()), out);
  }
}

absl::StatusOr<internal::FamilyBase*> Registry::Add(Spec spec) {
  if (absl::Status status = ValidateMetricName(spec.name); !status.ok()) return status;
  if (spec.help.empty()) {
    // Operators read these; promtool's lint also rejects a family without help.
    return absl::InvalidArgumentError(absl::StrCat(spec.name, ": help text is empty"));
  }
  if (!IsValidUtf8(spec.help)) {
    return absl::InvalidArgumentError(absl::StrCat(spec.name, ": help is not valid UTF-8"));
  }
  std::set<absl::string_view> seen;
  for (const std::string& label : spec.label_names) {
    if (absl::Status status = ValidateLabelName(label); !status.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(spec.name, ": ", status.message()));
    }
    if (!seen.insert(label).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(spec.name, ": label name \"", label, "\" appears twice"));
    }
    if (spec.type == MetricType::kHistogram && label == "le") {
      return absl::InvalidArgumentError(
          absl::StrCat(spec.name, ": \"le\" is reserved for histogram buckets"));
    }
  }
  if (absl::Status status = ValidateBounds(spec.bucket_bounds); !status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(spec.name, ": ", status.message()));
  }

  MutexLock lock(&mu_);
  if (auto it = families_.find(spec.name); it != families_.end()) {
    internal::FamilyBase& existing = *it->second;
    if (existing.type() != spec.type || existing.is_callback() != spec.is_callback) {
      return absl::AlreadyExistsError(
          absl::StrCat(spec.name, " is already registered as a ",
                       KindName(existing.type(), existing.is_callback()), ", not a ",
                       KindName(spec.type, spec.is_callback)));
    }
    if (existing.help() != spec.help || existing.label_names() != spec.label_names ||
        existing.bucket_bounds() != spec.bucket_bounds) {
      return absl::AlreadyExistsError(
          absl::StrCat(spec.name, " is already registered with different help, labels or buckets"));
    }
    return &existing;
  }
  const std::vector<std::string> sample_names = SampleNames(spec.type, spec.name);
  for (const std::string& sample : sample_names) {
    if (auto it = sample_names_.find(sample); it != sample_names_.end()) {
      return absl::AlreadyExistsError(absl::StrCat(spec.name, " would emit samples named ", sample,
                                                   ", which ", it->second, " already emits"));
    }
  }

  std::string name(spec.name);
  std::unique_ptr<internal::FamilyBase> family;
  if (spec.is_callback) {
    family.reset(
        new CallbackFamily(spec.type, name, std::string(spec.help), std::move(spec.label_names)));
  } else if (spec.type == MetricType::kCounter) {
    family.reset(new CounterFamily(spec.type, name, std::string(spec.help),
                                   std::move(spec.label_names), {}));
  } else if (spec.type == MetricType::kGauge) {
    family.reset(
        new GaugeFamily(spec.type, name, std::string(spec.help), std::move(spec.label_names), {}));
  } else {
    family.reset(new HistogramFamily(spec.type, name, std::string(spec.help),
                                     std::move(spec.label_names), std::move(spec.bucket_bounds)));
  }
  for (const std::string& sample : sample_names) sample_names_.emplace(sample, name);
  internal::FamilyBase* result = family.get();
  families_.emplace(std::move(name), std::move(family));
  return result;
}

absl::StatusOr<CounterFamily*> Registry::AddCounter(absl::string_view name, absl::string_view help,
                                                    std::vector<std::string> label_names) {
  absl::StatusOr<internal::FamilyBase*> family =
      Add({MetricType::kCounter, false, name, help, std::move(label_names), {}});
  if (!family.ok()) return family.status();
  auto* counters = static_cast<CounterFamily*>(*family);
  // An unlabelled series exists from registration on, so it reads 0 rather than absent.
  if (counters->label_names().empty()) counters->WithLabels({});
  return counters;
}

absl::StatusOr<GaugeFamily*> Registry::AddGauge(absl::string_view name, absl::string_view help,
                                                std::vector<std::string> label_names) {
  absl::StatusOr<internal::FamilyBase*> family =
      Add({MetricType::kGauge, false, name, help, std::move(label_names), {}});
  if (!family.ok()) return family.status();
  auto* gauges = static_cast<GaugeFamily*>(*family);
  if (gauges->label_names().empty()) gauges->WithLabels({});
  return gauges;
}

absl::StatusOr<HistogramFamily*> Registry::AddHistogram(absl::string_view name,
                                                        absl::string_view help,
                                                        std::vector<double> bucket_bounds,
                                                        std::vector<std::string> label_names) {
  absl::StatusOr<internal::FamilyBase*> family =
      Add({MetricType::kHistogram, false, name, help, std::move(label_names),
           std::move(bucket_bounds)});
  if (!family.ok()) return family.status();
  auto* histograms = static_cast<HistogramFamily*>(*family);
  if (histograms->label_names().empty()) histograms->WithLabels({});
  return histograms;
}

absl::StatusOr<CallbackFamily*> Registry::AddCallbackGauge(absl::string_view name,
                                                           absl::string_view help,
                                                           std::vector<std::string> label_names) {
  absl::StatusOr<internal::FamilyBase*> family =
      Add({MetricType::kGauge, true, name, help, std::move(label_names), {}});
  if (!family.ok()) return family.status();
  return static_cast<CallbackFamily*>(*family);
}

absl::StatusOr<CallbackFamily*> Registry::AddCallbackCounter(absl::string_view name,
                                                             absl::string_view help,
                                                             std::vector<std::string> label_names) {
  absl::StatusOr<internal::FamilyBase*> family =
      Add({MetricType::kCounter, true, name, help, std::move(label_names), {}});
  if (!family.ok()) return family.status();
  return static_cast<CallbackFamily*>(*family);
}

void Registry::SerializeTo(std::string* out) const {
  // Families are never removed, so the pointers outlive the lock. Releasing it before the
  // families run their callbacks means a callback's locks never nest inside the registry's,
  // and registration does not wait for a scrape.
  std::vector<const internal::FamilyBase*> families;
  {
    MutexLock lock(&mu_);
    families.reserve(families_.size());
    for (const auto& [name, family] : families_) families.push_back(family.get());
  }
  for (const internal::FamilyBase* family : families) family->AppendText(out);
}

std::string Registry::Serialize() const {
  std::string out;
  SerializeTo(&out);
  return out;
}

absl::StatusOr<std::vector<double>> ExponentialBuckets(double start, double factor, int count) {
  if (!(start > 0) || !(factor > 1) || count < 1 || !std::isfinite(start) ||
      !std::isfinite(factor)) {
    return absl::InvalidArgumentError(absl::StrCat("ExponentialBuckets needs start > 0, ",
                                                   "factor > 1, count >= 1; got ", start, ", ",
                                                   factor, ", ", count));
  }
  std::vector<double> bounds;
  bounds.reserve(count);
  double bound = start;
  for (int i = 0; i < count; ++i, bound *= factor) {
    if (!std::isfinite(bound)) return absl::InvalidArgumentError("ExponentialBuckets overflow");
    bounds.push_back(bound);
  }
  return bounds;
}

absl::StatusOr<std::vector<double>> LinearBuckets(double start, double width, int count) {
  if (!(width > 0) || count < 1 || !std::isfinite(start) || !std::isfinite(width)) {
    return absl::InvalidArgumentError(absl::StrCat("LinearBuckets needs width > 0, count >= 1; ",
                                                   "got ", start, ", ", width, ", ", count));
  }
  std::vector<double> bounds;
  bounds.reserve(count);
  for (int i = 0; i < count; ++i) {
    const double bound = start + width * i;
    if (!std::isfinite(bound)) return absl::InvalidArgumentError("LinearBuckets overflow");
    bounds.push_back(bound);
  }
  return bounds;
}

}  // namespace kvarn::metrics
