// `kvarnctl codec ...`: the codec on the user's own K/V, no daemon needed.
//   codec encode   one tile of one head (.npy) -> a record file
//   codec decode   a record file -> the dequantized tile (.npy)
//   codec eval     presets side by side on a whole K/V dump
//   codec synth    synthetic K/V and queries to try the above on
#ifndef KVARN_CLIENT_KVARNCTL_CODEC_COMMAND_H_
#define KVARN_CLIENT_KVARNCTL_CODEC_COMMAND_H_

#include <span>
#include <string>

#include "client/kvarnctl/command.h"

namespace kvarn::ctl {

// The `codec` entry of kvarnctl's command table: args are what follows "codec".
int RunCodecCommand(std::span<const std::string> args, const CommandIo& io);

// The codec subcommands, callable on their own (tests); args follow the subcommand name.
int RunCodecEncode(std::span<const std::string> args, const CommandIo& io);
int RunCodecDecode(std::span<const std::string> args, const CommandIo& io);
int RunCodecEval(std::span<const std::string> args, const CommandIo& io);
int RunCodecSynth(std::span<const std::string> args, const CommandIo& io);

}  // namespace kvarn::ctl

#endif  // KVARN_CLIENT_KVARNCTL_CODEC_COMMAND_H_
