// Compiles and links against the installed kvarn package; run, it exercises the codec and
// fails cleanly when no daemon listens at the given socket.
#include <cstdio>

#include "client/lib/client.h"

int main(int argc, char** argv) {
  kvarn::Preset preset;
  if (!kvarn::ParsePreset("kvarn_k4v2_g128", &preset).ok() || preset.RecordBytes(128) != 13824) return 1;
  auto client = kvarn::Client::Connect(argc > 1 ? argv[1] : "unix:/nonexistent.sock", {}, absl::Milliseconds(200));
  std::printf("codec %s, connect: %s\n", kvarn::Codec::Default().name().data(),
              client.ok() ? "ok" : std::string(client.status().message()).c_str());
  return client.ok() ? 0 : (client.status().code() == absl::StatusCode::kUnavailable ? 0 : 1);
}
