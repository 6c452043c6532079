"""kvarn: Python client of kvarnd, the KVarN-quantized KV-cache daemon, and its codec.

Bindings over the C++ client library (``kvarn::Client``) and the codec; nothing here
reimplements them. A session maps the daemon's pool into this process, writes the K/V of new
tokens into its tail slot in shared memory and reads sealed blocks in place::

    import numpy as np, kvarn

    client = kvarn.Client("unix:/run/kvarnd/kvarnd.sock")
    layout = client.layout()                      # the daemon's model layout
    with client.open_session("team-a", max_sequences=4) as s:
        prompt = list(range(1000, 1300))
        seq, cached, table = s.create_sequence(prompt)
        shape = (len(prompt) - cached, layout.num_layers, layout.num_kv_heads, layout.head_dim)
        k = np.random.randn(*shape).astype(np.float16)   # from your model's attention layers
        v = np.random.randn(*shape).astype(np.float16)
        info = s.append(seq, prompt[cached:], k, v)     # staged in shared memory, committed
        q = np.random.randn(2 * layout.num_kv_heads, layout.head_dim).astype(np.float32)
        out = s.attend(seq, 0, q)                       # fused decode attention, layer 0

Names:

* :class:`Client`, :class:`Session`: the connection and a session (lease, secret, mapping);
  :class:`Layout`, :class:`SequenceInfo`, :class:`SequenceTable`, :class:`AppendInfo`.
* :mod:`kvarn.codec`: encode, decode and evaluate K/V with the codec, no daemon.
* :class:`Error` and one subclass per gRPC status code (:class:`NotFoundError`, ...), with
  ``.code`` (``"NOT_FOUND"``), ``.code_value`` and ``.message``; see :mod:`kvarn.errors`.
  Bad input found before anything is sent raises ValueError or TypeError.

Arrays: numpy arrays or torch CPU tensors in (torch is used only if the program imported it);
numpy arrays out, or torch tensors where the input was one (``attend``). C-contiguous arrays
of the dtype a call takes (float16 or float32 K/V, float32 queries, uint32 token ids) are
passed to C++ without a copy; others are converted first. Blocking calls release the GIL.

docs/python.md is the guide.
"""

from . import errors
from .errors import *  # noqa: F401,F403
from ._kvarn import AppendInfo, Client, Layout, SequenceInfo, SequenceTable, Session
from . import codec

from ._kvarn import __version__

__all__ = ["Client", "Session", "Layout", "SequenceInfo", "SequenceTable", "AppendInfo",
           "codec", "errors"] + errors.__all__
