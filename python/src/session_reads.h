// kvarn.Session's in-place reads: decode attention, dequantized sequences and blocks
// (session_reads.cc).
#ifndef KVARN_PYTHON_SRC_SESSION_READS_H_
#define KVARN_PYTHON_SRC_SESSION_READS_H_

#include <pybind11/pybind11.h>

#include <cstdint>
#include <optional>

#include "python/src/session_handle.h"

namespace kvarn::py {

// Session.attend(sequence, layer, queries, out=None).
pybind11::object Attend(PySession& ps, SequenceId seq, Int<int> layer, pybind11::object queries,
                        pybind11::object out, bool return_lse);
// Session.dequantize(sequence, layer=None): (keys, values) [T][L][H][D] or [T][H][D].
pybind11::tuple Dequantize(PySession& ps, SequenceId seq, std::optional<Int<int>> layer);
// Session.dequantize_block(block, layer=None, head=None): [L][H][G][D], less fixed axes.
pybind11::tuple DequantizeBlock(PySession& ps, BlockId block, std::optional<Int<int>> layer,
                                std::optional<Int<int>> head);

}  // namespace kvarn::py

#endif  // KVARN_PYTHON_SRC_SESSION_READS_H_
