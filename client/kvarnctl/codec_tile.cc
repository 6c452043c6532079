#include "client/kvarnctl/codec_tile.h"

#include <cmath>
#include <vector>

#include "client/kvarnctl/codec_io.h"
#include "kernels/codec.h"

namespace kvarn::ctl {
namespace {

constexpr int kHeadDims[] = {64, 128, 256, 512};

double RelL2(const std::vector<float>& ref, const std::vector<float>& got) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = static_cast<double>(got[i]) - ref[i];
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

CodecStatus WithPrefix(const std::string& prefix, const CodecStatus& s) {
  return s.ok() ? s : CodecStatus(s.code(), prefix + s.message());
}

}  // namespace

CodecStatus EncodeFiles(const EncodeRequest& request, EncodeReport* report) {
  Preset preset;
  KVARN_RETURN_IF_ERROR(ParsePreset(request.preset, &preset));
  std::vector<float> keys, values;
  int dk = 0, dv = 0;
  KVARN_RETURN_IF_ERROR(LoadTile(request.keys_path, preset, &keys, &dk));
  KVARN_RETURN_IF_ERROR(LoadTile(request.values_path, preset, &values, &dv));
  if (dk != dv) {
    return InvalidArgument(request.keys_path + " has head_dim " + std::to_string(dk) + " but " +
                           request.values_path + " has " + std::to_string(dv) +
                           "; keys and values must have the same shape");
  }
  std::vector<uint8_t> record(preset.RecordBytes(dk));
  EncodeOptions options;
  options.iterations = request.iterations;
  const Codec& codec = Codec::Default();
  KVARN_RETURN_IF_ERROR(WithPrefix(
      "codec: ",
      codec.EncodeTile(preset, dk, TileIn{keys.data(), values.data()}, record, options)));
  KVARN_RETURN_IF_ERROR(WriteFileBytes(request.out_path, record.data(), record.size()));
  report->preset = preset.Name();
  report->head_dim = dk;
  report->record_bytes = record.size();
  report->bits_per_element = preset.BitsPerElement(dk);
  if (request.verify) {
    std::vector<uint8_t> written;
    KVARN_RETURN_IF_ERROR(ReadFileBytes(request.out_path, &written));
    int inferred = 0;
    KVARN_RETURN_IF_ERROR(InferHeadDim(preset, written.size(), &inferred));
    if (inferred != dk || written != record) {
      return CodecStatus(CodecCode::kInternal, request.out_path +
                                                   ": the record read back does not match what was "
                                                   "written (head_dim inferred " +
                                                   std::to_string(inferred) + ", encoded " +
                                                   std::to_string(dk) + ")");
    }
    std::vector<float> k_hat(keys.size()), v_hat(values.size());
    KVARN_RETURN_IF_ERROR(WithPrefix(
        "codec: ",
        codec.DecodeTile(preset, inferred, written, TileOut{k_hat.data(), v_hat.data()})));
    report->inferred_head_dim = inferred;
    report->k_rel_l2 = RelL2(keys, k_hat);
    report->v_rel_l2 = RelL2(values, v_hat);
  }
  return {};
}

CodecStatus InferHeadDim(const Preset& preset, size_t record_bytes, int* head_dim) {
  std::vector<int> fits;
  std::string sizes;
  for (int d : kHeadDims) {
    const size_t bytes = preset.RecordBytes(d);
    if (bytes == record_bytes) fits.push_back(d);
    sizes += (sizes.empty() ? "" : ", ") + std::to_string(bytes) + " (D=" + std::to_string(d) + ")";
  }
  if (fits.empty()) {
    return InvalidArgument("the record is " + std::to_string(record_bytes) +
                           " bytes, which is no " + preset.Name() + " record: its records are " +
                           sizes + " bytes; check --preset");
  }
  if (fits.size() > 1) {
    return InvalidArgument("a " + std::to_string(record_bytes) + "-byte " + preset.Name() +
                           " record fits more than one head_dim; pass --head-dim");
  }
  *head_dim = fits[0];
  return {};
}

CodecStatus DecodeFiles(const DecodeRequest& request, DecodeReport* report) {
  Preset preset;
  KVARN_RETURN_IF_ERROR(ParsePreset(request.preset, &preset));
  std::vector<uint8_t> record;
  KVARN_RETURN_IF_ERROR(ReadFileBytes(request.record_path, &record));
  int d = request.head_dim;
  if (d == 0) {
    KVARN_RETURN_IF_ERROR(
        WithPrefix(request.record_path + ": ", InferHeadDim(preset, record.size(), &d)));
  } else {
    KVARN_RETURN_IF_ERROR(WithPrefix("--head-dim: ", CheckHeadDim(d)));
    if (record.size() != preset.RecordBytes(d)) {
      return InvalidArgument(request.record_path + " is " + std::to_string(record.size()) +
                             " bytes; a " + preset.Name() + " record with head_dim " +
                             std::to_string(d) + " is " + std::to_string(preset.RecordBytes(d)) +
                             " bytes");
    }
  }
  const int g = preset.tile_tokens;
  std::vector<float> keys(static_cast<size_t>(g) * d), values(keys.size());
  KVARN_RETURN_IF_ERROR(WithPrefix(
      request.record_path + ": codec: ",
      Codec::Default().DecodeTile(preset, d, record, TileOut{keys.data(), values.data()})));
  const std::vector<size_t> shape = {static_cast<size_t>(g), static_cast<size_t>(d)};
  KVARN_RETURN_IF_ERROR(WriteF32(request.keys_out, shape, keys.data()));
  KVARN_RETURN_IF_ERROR(WriteF32(request.values_out, shape, values.data()));
  report->preset = preset.Name();
  report->head_dim = d;
  report->head_dim_inferred = request.head_dim == 0;
  report->record_bytes = record.size();
  report->tokens = g;
  return {};
}

}  // namespace kvarn::ctl
