import json

import pytest

from mmrft.data import DataError, read_mmrft_jsonl


def write_lines(path, lines):
    path.write_text(
        "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines)
    )
    return path


def good(i, image="img.png"):
    return {
        "id": f"s{i}",
        "messages": [
            {
                "role": "user",
                "content": [{"type": "image", "image": image}, {"type": "text", "text": "Q?"}],
            }
        ],
        "target": "red",
        "meta": {"choices": ["red", "blue"]},
    }


def test_reads_and_resolves_media_relative_to_file(tmp_path):
    path = write_lines(
        tmp_path / "d.jsonl",
        [good(0), good(1, "/abs/x.png"), {"messages": "plain text", "target": 3}],
    )
    samples, stats = read_mmrft_jsonl(path)
    assert [s.id for s in samples] == ["s0", "s1", "3"]
    assert samples[0].media() == [str(tmp_path / "img.png")]
    assert samples[1].media("image") == ["/abs/x.png"]
    assert samples[2].text() == "plain text"
    assert stats.kept == 3


def test_missing_field_names_file_and_line(tmp_path):
    bad = good(1)
    del bad["target"]
    path = write_lines(tmp_path / "d.jsonl", [good(0), bad])
    with pytest.raises(DataError, match=r"d.jsonl:2: missing field 'target'"):
        read_mmrft_jsonl(path)


def test_skip_counts_what_it_drops(tmp_path):
    bad = good(1)
    del bad["messages"]
    path = write_lines(tmp_path / "d.jsonl", [good(0), bad, "{not json", good(0)])
    samples, stats = read_mmrft_jsonl(path, on_error="skip")
    assert [s.id for s in samples] == ["s0"]
    assert stats.read == 4 and stats.kept == 1
    assert sum(stats.skipped.values()) == 3
    assert "skipped" in stats.summary()


def test_check_hook_errors_and_skips(tmp_path):
    path = write_lines(tmp_path / "d.jsonl", [good(0), good(1)])

    def check(sample):
        if sample.id == "s1":
            raise DataError(f"{sample.media()[0]}: cannot identify image file")

    with pytest.raises(DataError, match="img.png: cannot identify image file"):
        read_mmrft_jsonl(path, check=check)
    samples, stats = read_mmrft_jsonl(path, on_error="skip", check=check)
    assert len(samples) == 1 and sum(stats.skipped.values()) == 1


def test_bad_content_part(tmp_path):
    line = good(0)
    line["messages"][0]["content"].append({"type": "pdf", "pdf": "x"})
    with pytest.raises(DataError, match=r"d.jsonl:1: .*type 'pdf'"):
        read_mmrft_jsonl(write_lines(tmp_path / "d.jsonl", [line]))
