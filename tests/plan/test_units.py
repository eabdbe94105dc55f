import pytest

from iokernels.plan.units import check_dtype, format_bytes, itemsize, parse_size


@pytest.mark.parametrize("text, value", [
    ("196608", 196608), ("192KB", 196608), ("192KiB", 196608), ("192kb", 196608), ("192 KB", 196608),
    ("1MB", 1048576), ("1MiB", 1048576), ("48K", 49152), ("0.5KB", 512), (4096, 4096),
])
def test_parse_size(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "KB", "12QB", "-5", "0", "1.3B", "1e3", "12 K B"])
def test_parse_size_rejects(text):
    with pytest.raises(ValueError, match="size"):
        parse_size(text)


def test_dtypes():
    assert [itemsize(x) for x in ("float32", "float16", "bfloat16", "FLOAT16")] == [4, 2, 2, 2]
    with pytest.raises(ValueError, match=r"int8.*float32, float16, bfloat16"):
        check_dtype("int8")


def test_format_bytes():
    assert format_bytes(196608) == "192.00 KiB"
    assert format_bytes(12) == "12 B"
    assert format_bytes(None) == "-"
