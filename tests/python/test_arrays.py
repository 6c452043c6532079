"""The zero-copy rule for arguments: C-contiguous arrays of the dtype a call takes are used in
place; anything else is converted (one copy) or refused."""

import numpy as np
import pytest

from kvarn import _kvarn


def test_contiguous_float16_and_float32_kv_are_used_in_place():
    for dtype in (np.float16, np.float32):
        a = np.ones((3, 2, 2, 64), dtype)
        used, zero_copy = _kvarn._as_kv_input(a)
        assert zero_copy and np.shares_memory(used, a)
        assert used.dtype == dtype


def test_other_kv_is_converted_once():
    base = np.arange(3 * 2 * 2 * 64, dtype=np.float32).reshape(3, 2, 2, 64)
    cases = [
        base[:, :, :, ::2],                    # strided view
        base.astype(np.float64),               # another float dtype
        base.astype(">f4"),                    # big-endian
        base.tolist(),                         # a list
    ]
    for a in cases:
        used, zero_copy = _kvarn._as_kv_input(a)
        assert not zero_copy
        assert used.dtype == np.float32 and used.flags.c_contiguous
        np.testing.assert_array_equal(used, np.asarray(a, np.float32))
    # float16 stays float16 where fp16 is taken (exact), float32 where it is not.
    half = base.astype(np.float16)[:, :, :, ::2]
    assert _kvarn._as_kv_input(half)[0].dtype == np.float16
    assert _kvarn._as_kv_input(half, allow_f16=False)[0].dtype == np.float32
    assert not _kvarn._as_kv_input(base.astype(np.float16), allow_f16=False)[1]


def test_non_float_kv_is_a_type_error():
    for a in (np.ones((2, 2), np.int32), np.ones((2, 2), bool), np.ones((2, 2), np.complex64)):
        with pytest.raises(TypeError, match="expected a float array"):
            _kvarn._as_kv_input(a)


def test_token_ids_in_place_when_uint32_else_checked_and_converted():
    ids = np.arange(10, dtype=np.uint32)
    used, zero_copy = _kvarn._as_token_ids(ids)
    assert zero_copy and np.shares_memory(used, ids)
    for a in ([1, 2, 3], np.array([1, 2, 3], np.int64), np.array([1, 2, 3], np.uint64), (1, 2, 3)):
        used, zero_copy = _kvarn._as_token_ids(a)
        assert not zero_copy and used.dtype == np.uint32
        np.testing.assert_array_equal(used, [1, 2, 3])
    assert _kvarn._as_token_ids([])[0].size == 0
    np.testing.assert_array_equal(_kvarn._as_token_ids([2**32 - 1])[0], [2**32 - 1])
    with pytest.raises(ValueError, match="holds 4294967296; token ids are in"):
        _kvarn._as_token_ids([2**32])
    with pytest.raises(ValueError, match="holds -1"):
        _kvarn._as_token_ids([0, -1])
    with pytest.raises(TypeError, match="has dtype float64; token ids are integers"):
        _kvarn._as_token_ids([0.5])
    with pytest.raises(TypeError, match="has dtype bool"):
        _kvarn._as_token_ids([True])
    with pytest.raises(ValueError, match="1-D"):
        _kvarn._as_token_ids(5)


def test_torch_tensors_are_read_in_place():
    torch = pytest.importorskip("torch")
    t = torch.ones((3, 2, 2, 64), dtype=torch.float16)
    used, zero_copy = _kvarn._as_kv_input(t)
    assert zero_copy and used.ctypes.data == t.data_ptr()
    used, zero_copy = _kvarn._as_kv_input(t.bfloat16())
    assert not zero_copy and used.dtype == np.float32
    used, zero_copy = _kvarn._as_kv_input(t.float().requires_grad_(True))
    assert zero_copy
    ids, zero_copy = _kvarn._as_token_ids(torch.arange(5))
    assert not zero_copy and ids.dtype == np.uint32
    if torch.cuda.is_available():
        with pytest.raises(TypeError, match="kvarn takes CPU tensors"):
            _kvarn._as_kv_input(t.cuda())
