"""TextAssembler: whole characters only, stop strings cut exactly, nothing lost."""

import pytest

from edgespec.textstream import TextAssembler


def feed(pieces, stop=()):
    a = TextAssembler(stop)
    chunks = [a.push(p) for p in pieces]
    chunks.append(a.finish())
    return chunks, a


def test_emoji_split_across_tokens_is_released_whole():
    data = "hi 😀 ok".encode()
    pieces = [data[:4], data[4:5], data[5:7], data[7:]]     # 😀 is 4 bytes starting at 3
    chunks, _ = feed(pieces)
    assert "".join(chunks) == "hi 😀 ok"
    assert all("\ufffd" not in c for c in chunks)
    assert chunks[0] == "hi "


def test_cjk_byte_by_byte():
    data = "日本語".encode()
    chunks, _ = feed([bytes([b]) for b in data])
    assert "".join(chunks) == "日本語"
    assert [c for c in chunks if c] == ["日", "本", "語"]


def test_stop_string_across_tokens_is_cut_exactly():
    chunks, a = feed([b"Hello", b" wor", b"ld! ST", b"OP and more"], stop=["STOP"])
    assert "".join(chunks) == "Hello world! "
    assert a.stopped


def test_partial_stop_prefix_is_released_when_it_diverges():
    chunks, a = feed([b"ab", b"S", b"T", b"x"], stop=["STOP"])
    assert "".join(chunks) == "abSTx"
    assert not a.stopped
    assert chunks[1] == "" and chunks[2] == ""               # held while it could be a stop


def test_earliest_of_several_stop_strings_wins():
    chunks, _ = feed([b"one two three"], stop=["three", "two"])
    assert "".join(chunks) == "one "


def test_character_cut_off_by_the_end_is_dropped():
    chunks, _ = feed([b"ok ", "é".encode()[:1]])
    assert "".join(chunks) == "ok "


def test_invalid_bytes_inside_the_text_are_replaced():
    chunks, _ = feed([b"a\xff", b"b"])
    assert "".join(chunks) == "a\ufffdb"


@pytest.mark.parametrize("cut", range(1, 12))
def test_any_split_gives_the_same_text(cut):
    data = "a😀b日c".encode()
    chunks, _ = feed([data[:cut], data[cut:]])
    assert "".join(chunks) == "a😀b日c"
