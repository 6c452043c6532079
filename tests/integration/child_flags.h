// What the integration tests' helper processes (kvarn_test_client, kvarn_attacker) share:
// their command line (a mode, then --key=value flags; a bare --key means "1") and their
// replies, one line each on stdout, flushed at once for the test that reads them.
#ifndef KVARN_TESTS_INTEGRATION_CHILD_FLAGS_H_
#define KVARN_TESTS_INTEGRATION_CHILD_FLAGS_H_

#include <cstdint>
#include <map>
#include <string>

namespace kvarn::it {

using ChildFlags = std::map<std::string, std::string>;

// The flags of argv[first..argc); arguments that do not start with "--" are skipped.
ChildFlags ParseChildFlags(int argc, char** argv, int first);
// A flag's value, or `def` when it is absent.
std::string Flag(const ChildFlags& f, const std::string& key, const std::string& def = "");
// A flag's value as a number, or `def` when it is absent or not a number.
uint64_t FlagU64(const ChildFlags& f, const std::string& key, uint64_t def = 0);
// Writes `line` and a newline to stdout and flushes it.
void Say(const std::string& line);

}  // namespace kvarn::it

#endif  // KVARN_TESTS_INTEGRATION_CHILD_FLAGS_H_
