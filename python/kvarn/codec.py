"""The KVarN codec on arrays, no daemon needed.

The same code as the daemon and ``kvarnctl codec`` (``Codec::Default()``, the Highway SIMD
implementation; :func:`implementation` names the instruction set):

* :func:`encode` ``(preset, keys, values) -> records``: tiles (..., G, D) to uint8 records;
* :func:`decode` ``(preset, records) -> (keys, values)``: records back to float32 tiles;
* :func:`eval` ``(presets, keys, values) -> dict``: reconstruction and attention errors,
  bits and speed, exactly as ``kvarnctl codec eval --json`` reports them;
* :func:`presets`, :func:`preset_info`: the preset names and their parameters.

Presets: ``fp16`` and ``{kvarn|kivi|hadamard}_k{2|4}v{2|4}_g{64|128}``. kvarn: Hadamard
rotation, dual-axis balancing and round-to-nearest (kvarnd's default ``kvarn_k4v2_g128``);
kivi: round-to-nearest only; hadamard: rotation and round-to-nearest.

Inputs are numpy arrays or torch CPU tensors; float32 and float16 C-contiguous arrays are
read in place. An unknown preset or a value the codec rejects (NaN, Inf) raises
:class:`kvarn.InvalidArgumentError` (a ValueError); wrong shapes and dtypes raise ValueError
or TypeError.
"""

from ._kvarn import codec as _codec

encode = _codec.encode
decode = _codec.decode
eval = _codec.eval  # noqa: A001 (the kvarnctl subcommand's name)
presets = _codec.presets
preset_info = _codec.preset_info
implementation = _codec.implementation

__all__ = ["encode", "decode", "eval", "presets", "preset_info", "implementation"]
