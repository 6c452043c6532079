#include "client/kvarnctl/command.h"

#include <utility>

namespace kvarn::ctl {

int ExitCodeFor(const CodecStatus& status) {
  if (status.ok()) return kExitOk;
  return status.code() == CodecCode::kInvalidArgument ? kExitUsage : kExitFailure;
}

int ReportError(const CommandIo& io, const CodecStatus& status) {
  io.err << "kvarnctl: error: " << status.message() << '\n';
  return ExitCodeFor(status);
}

CodecStatus WriteFailure(std::string message) {
  return CodecStatus(CodecCode::kFailedPrecondition, std::move(message));
}

}  // namespace kvarn::ctl
