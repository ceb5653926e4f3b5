"""Tiny Qwen-VL checkpoints and the Qwen-VL family adapters (offline, CPU)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers import chat_text, family_fixtures
from PIL import Image

from mmrft.data import DataError, Sample
from mmrft.models import tiny
from mmrft.models.family import MediaBudget, family_for_model_type
from mmrft.models.qwen_vl import IMAGE_CACHE, Qwen2VL, Qwen3VL, Qwen25VL, check_media
from mmrft.plugins import MODEL_FAMILIES
from mmrft.typecheck import ConfigError

ASSETS = Path(__file__).resolve().parents[1] / "assets"
FAMILIES = {"qwen2_5_vl": Qwen25VL, "qwen2_vl": Qwen2VL}


model_dirs, loaded = family_fixtures(FAMILIES)


def conversation(image: str, text: str = "What colour is the shape?") -> list[dict]:
    return [
        {
            "role": "user",
            "content": [{"type": "image", "image": image}, {"type": "text", "text": text}],
        }
    ]


def test_families_registered() -> None:
    assert MODEL_FAMILIES.get("qwen2_5_vl") is Qwen25VL
    assert family_for_model_type("qwen2_vl") is Qwen2VL
    assert family_for_model_type("qwen3_vl") is Qwen3VL
    assert (Qwen2VL.box_frame, Qwen25VL.box_frame, Qwen3VL.box_frame) == (
        "norm1000",
        "input_pixels",
        "norm1000",
    )
    assert "bbox_2d" in Qwen25VL.box_instruction and "pixel" in Qwen25VL.box_instruction
    assert "1000" in Qwen2VL.box_instruction


@pytest.mark.parametrize("name", list(FAMILIES))
def test_tiny_loads_offline_with_auto_classes(model_dirs: dict[str, Path], name: str) -> None:
    from transformers import AutoModelForImageTextToText, AutoProcessor

    path = model_dirs[name]
    assert sum(p.stat().st_size for p in path.iterdir()) < 3_000_000
    processor = AutoProcessor.from_pretrained(path)
    model = AutoModelForImageTextToText.from_pretrained(path)
    expected = "Qwen2_5_VLProcessor" if name == "qwen2_5_vl" else "Qwen2VLProcessor"
    assert type(processor).__name__ == expected
    assert model.config.model_type == name
    assert model.config.tie_word_embeddings
    tok = processor.tokenizer
    assert model.config.text_config.vocab_size == len(tok)
    assert (tok.eos_token, tok.pad_token, tok.bos_token) == ("<|im_end|>", "<|endoftext|>", None)
    assert model.generation_config.eos_token_id == [tok.eos_token_id, tok.pad_token_id]
    for token in tiny.QWEN2_VL_SPECIAL:
        ids = tok.encode(token, add_special_tokens=False)
        assert len(ids) == 1 and ids[0] >= len(tok) - len(tiny.QWEN2_VL_SPECIAL) - 8
    # The demo's words are single tokens, with and without a leading space.
    for word in tiny.COLOURS + tiny.SHAPES + ("What", "colour", "image", "answer", "think"):
        assert len(tok.encode(word, add_special_tokens=False)) == 1, word
        assert len(tok.encode(" " + word, add_special_tokens=False)) == 1, word
    assert len(tok.encode("<answer>", add_special_tokens=False)) == 2  # "<answer" ">"
    for word in tiny.COLOURS + tiny.SHAPES + tuple("ABCD"):  # "<answer" ">red" "</" "answer" ">"
        assert len(tok.encode(f"<answer>{word}</answer>", add_special_tokens=False)) == 5, word


def test_chat_template_matches_the_real_one(loaded: dict) -> None:
    _, processor, _ = loaded["qwen2_5_vl"]
    text = chat_text(processor, conversation("x.png", "Hi"))
    assert text == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
        "<|vision_start|><|image_pad|><|vision_end|>Hi<|im_end|>\n<|im_start|>assistant\n"
    )
    with_system = [{"role": "system", "content": "S"}, *conversation("x.png", "Hi")]
    text = chat_text(processor, with_system, prompt=False)
    assert "helpful" not in text and text.startswith("<|im_start|>system\nS<|im_end|>")


@pytest.mark.parametrize("name", list(FAMILIES))
def test_prepare_left_pads_and_matches_image_tokens(loaded: dict, images: dict, name: str) -> None:
    family, processor, _ = loaded[name]
    convs = [
        conversation(images["small"]),
        conversation(images["wide"], "How many shapes are there?"),
    ]
    batch = family.prepare(processor, convs)
    assert {"input_ids", "attention_mask", "pixel_values", "image_grid_thw"} <= set(batch)
    ids, mask, grid = batch["input_ids"], batch["attention_mask"], batch["image_grid_thw"]
    assert grid.tolist() == [[1, 4, 4], [1, 6, 8]]  # 56×56 → 4×4 patches, 112×84 → 6×8
    assert batch["pixel_values"].shape[0] == int(grid.prod(dim=-1).sum())
    pad = processor.tokenizer.pad_token_id
    image_id = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    for row in range(2):
        n_pad = int((mask[row] == 0).sum())
        assert mask[row, n_pad:].all() and (ids[row, :n_pad] == pad).all()  # left padding
        assert int((ids[row] == image_id).sum()) == int(grid[row].prod()) // 4
    assert (mask[0] == 0).any() and mask[:, -1].all()


def test_prepare_reads_each_image_once(loaded: dict, images: dict) -> None:
    family, processor, _ = loaded["qwen2_5_vl"]
    IMAGE_CACHE.clear()
    family.prepare(processor, [conversation(images["wide"])] * 8)
    assert IMAGE_CACHE.misses == 1 and IMAGE_CACHE.hits == 7


@pytest.mark.parametrize("name", list(FAMILIES))
def test_generate_on_cpu(loaded: dict, images: dict, name: str) -> None:
    family, processor, model = loaded[name]
    batch = family.prepare(processor, [conversation(images["small"]), conversation(images["wide"])])
    suppress = family.suppress_token_ids(processor)
    assert len(suppress) == 5
    pad = processor.tokenizer.pad_token_id
    out = model.generate(
        **batch, max_new_tokens=4, do_sample=True, suppress_tokens=suppress, pad_token_id=pad
    )
    new = out[:, batch["input_ids"].shape[1] :]
    assert new.shape == (2, 4)
    assert not any(t in suppress for t in new.flatten().tolist())


def test_recollated_rows_keep_3d_positions(loaded: dict, images: dict) -> None:
    """Split/collate (any order) gives the same logits; so does a caller that drops
    mm_token_type_ids (the load_model hook derives it; transformers would use 1-D positions)."""
    family, processor, model = loaded["qwen2_5_vl"]
    batch = family.prepare(processor, [conversation(images["wide"]), conversation(images["small"])])
    rows = family.split_rows(batch, processor)
    collated = family.collate_rows(rows[::-1], processor.tokenizer.pad_token_id)
    bare = {k: v for k, v in collated.items() if k != "mm_token_type_ids"}
    with torch.no_grad():
        full = model(**batch).logits
        for inputs in (collated, bare):
            again = model(**inputs).logits
            assert torch.allclose(full[0, -1], again[1, -1], atol=1e-5)
            assert torch.allclose(full[1, -1], again[0, -1], atol=1e-5)
    if hasattr(family, "token_keys"):
        assert torch.equal(collated["mm_token_type_ids"][0], batch["mm_token_type_ids"][1])


@pytest.mark.parametrize(("cls", "budget"), [(Qwen25VL, None), (Qwen2VL, MediaBudget(3136, 6000))])
def test_input_size_matches_grid(
    loaded: dict, model_dirs: dict, tmp_path: Path, cls: type, budget: MediaBudget | None
) -> None:
    family = cls(budget)
    name = "qwen2_5_vl" if cls is Qwen25VL else "qwen2_vl"
    processor = family.load_processor(str(model_dirs[name]))
    for size in [(100, 70), (300, 180), (57, 200)]:
        path = tmp_path / f"{size[0]}x{size[1]}.png"
        Image.new("RGB", size, (10, 200, 10)).save(path)
        grid = family.prepare(processor, [conversation(str(path))])["image_grid_thw"][0]
        assert family.input_size(*size) == (int(grid[2]) * 14, int(grid[1]) * 14)
        # the processor's own resize agrees (budget applied at load time)
        direct = processor.image_processor(images=[Image.open(path)], return_tensors="pt")
        assert direct["image_grid_thw"][0].tolist() == grid.tolist()
    assert Qwen3VL().input_size(100, 70) == (96, 64)  # factor 32


def test_annotate_sets_meta() -> None:
    sample = Sample("s", [], target=[1, 2, 3, 4], meta={"image_size": [100, 70]})
    Qwen25VL().annotate(sample)
    assert sample.meta["box_frame"] == "input_pixels"
    assert sample.meta["input_size"] == [112, 56]  # round(2.5) = 2: half to even
    sample = Sample("t", [], meta={"image_size": [100, 70]})
    Qwen2VL().annotate(sample)
    assert sample.meta["box_frame"] == "norm1000" and sample.meta["input_size"] == [112, 56]


def test_missing_or_corrupt_image_names_the_file(
    loaded: dict, images: dict, tmp_path: Path
) -> None:
    family, processor, _ = loaded["qwen2_vl"]
    missing = str(tmp_path / "nope.png")
    corrupt = tmp_path / "broken.png"
    corrupt.write_bytes(b"\x89PNG\r\n\x1a\n not really a png")
    truncated = tmp_path / "truncated.png"
    truncated.write_bytes(Path(images["wide"]).read_bytes()[:60])
    for bad in (missing, str(corrupt), str(truncated)):
        with pytest.raises(DataError, match=bad.replace(".", r"\.")):
            family.prepare(processor, [conversation(images["small"]), conversation(bad)])
        with pytest.raises(DataError, match=bad.replace(".", r"\.")):
            check_media(Sample("s", conversation(bad)))
    good = Sample("g", conversation(images["wide"]))
    check_media(good)
    assert good.meta["image_size"] == [112, 84]


def test_family_checks_the_checkpoint(model_dirs: dict) -> None:
    with pytest.raises(ConfigError, match="model_type 'qwen2_5_vl'"):
        Qwen2VL().load_model(str(model_dirs["qwen2_5_vl"]))
    with pytest.raises(ConfigError, match="patch 16"):
        Qwen3VL().load_processor(str(model_dirs["qwen2_vl"]))


def test_vision_parameters_are_the_vision_tower(loaded: dict) -> None:
    family, _, model = loaded["qwen2_vl"]
    vision = {id(p) for p in family.vision_parameters(model)}
    names = [n for n, p in model.named_parameters() if id(p) in vision]
    assert names and all(".visual." in f".{n}" for n in names)
    assert len(vision) < len(list(model.parameters()))


def test_build_is_deterministic(tmp_path: Path) -> None:
    first = tiny.build_tiny("qwen2_vl", tmp_path / "a", seed=0)
    second = tiny.build_tiny("qwen2_vl", tmp_path / "b", seed=0)
    assert tiny.tree_digest(first) == tiny.tree_digest(second)
    names = sorted(p.name for p in first.iterdir())
    assert "model.safetensors" in names and "tokenizer.json" in names
    committed = ASSETS / "models" / "tiny-qwen2_vl"
    if (committed / "config.json").is_file():  # stale assets: rerun `mmrft make-tiny`
        import json

        import transformers

        built_with = json.loads((committed / "config.json").read_text())["transformers_version"]
        if built_with == transformers.__version__:
            assert tiny.tree_digest(committed) == tiny.tree_digest(first)
    other = tiny.build_tiny("qwen2_vl", tmp_path / "c", seed=1)
    assert (other / "model.safetensors").read_bytes() != (first / "model.safetensors").read_bytes()


def test_the_learner_size_is_a_wider_qwen3_vl_with_a_position_table(tmp_path: Path) -> None:
    """``size="learner"`` (scripts/make_learner.py's starting point): Qwen3-VL only, the sizes
    of LEARNER_TEXT / LEARNER_VISION, the tiny model's tokenizer; other families or sizes are
    refused by name."""
    import json

    from mmrft.models.tiny import qwen3

    folder = tiny.build_tiny("qwen3_vl", tmp_path / "learner", size="learner")
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "qwen3_vl"
    for key in ("hidden_size", "num_hidden_layers", "head_dim"):
        assert config["text_config"][key] == qwen3.LEARNER_TEXT[key]
    vision = config["vision_config"]
    assert vision["depth"] == qwen3.LEARNER_VISION["depth"] and vision["num_position_embeddings"]
    tiny_tokens = (ASSETS / "models" / "tiny-qwen3_vl" / "tokenizer.json").read_text()
    assert (folder / "tokenizer.json").read_text() == tiny_tokens
    with pytest.raises(ValueError, match="learner"):
        tiny.build_tiny("qwen2_5_vl", tmp_path / "x", size="learner")
    with pytest.raises(ValueError, match="huge"):
        tiny.build_tiny("qwen3_vl", tmp_path / "y", size="huge")


def test_video_frames_keep_their_time_step(loaded: dict, images: dict, tmp_path: Path) -> None:
    """A video given as frames: second_per_grid_ts survives split/collate (temporal mRoPE)."""
    family, processor, model = loaded["qwen2_5_vl"]
    frames = []
    for i in range(4):
        frames.append(str(tmp_path / f"frame{i}.png"))
        Image.new("RGB", (56, 56), (60 * i, 0, 0)).save(frames[-1])
    video = {
        "type": "video",
        "video": frames,
        "sample_fps": 1.0,
        "min_pixels": 3136,
        "max_pixels": 3136,
    }
    convs = [
        conversation(images["small"]),
        [{"role": "user", "content": [video, {"type": "text", "text": "Q"}]}],
    ]
    batch = family.prepare(processor, convs)
    assert batch["video_grid_thw"].tolist() == [[2, 4, 4]]
    assert batch["second_per_grid_ts"].tolist() == [2.0]  # temporal patch 2 / 1 fps
    rows = family.split_rows(batch, processor)
    assert "video_grid_thw" not in rows[0] or len(rows[0]["video_grid_thw"]) == 0
    collated = family.collate_rows(rows, processor.tokenizer.pad_token_id)
    with torch.no_grad():
        assert torch.allclose(model(**batch).logits, model(**collated).logits, atol=1e-5)
    with pytest.raises(DataError, match=r"missing\.mp4"):
        family.prepare(
            processor,
            [[{"role": "user", "content": [{"type": "video", "video": "/x/missing.mp4"}]}]],
        )


def test_box_instructions_are_in_the_tokenizer_corpus() -> None:
    assert set(tiny.BOX_INSTRUCTIONS) == {Qwen25VL.box_instruction, Qwen2VL.box_instruction}


def test_prepare_text_only(loaded: dict) -> None:
    family, processor, _ = loaded["qwen2_vl"]
    batch = family.prepare(processor, [[{"role": "user", "content": "Hi"}], conversation_text()])
    assert "pixel_values" not in batch and batch["input_ids"].shape[0] == 2


def conversation_text() -> list[dict]:
    return [{"role": "user", "content": [{"type": "text", "text": "How many?"}]}]
