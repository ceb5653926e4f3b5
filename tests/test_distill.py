"""On-policy distillation (``teacher.path``, ``algorithm.distill_coef``): the per-token
advantage in closed form, the surrogate's gradient, a teacher equal to the student teaching
nothing, start-up refusals, the group-shared teacher forward, exact resume."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers import NO_EVAL, short_run
from safetensors.torch import load_file

from mmrft.algorithms import distill_advantages, full_reverse_kl, grpo_loss
from mmrft.config import load_config
from mmrft.models.tiny.base import build_tiny
from mmrft.policy.teacher import check_teacher
from mmrft.training.trainer import train
from mmrft.typecheck import ConfigError

REPO = Path(__file__).resolve().parents[1]
MODEL = REPO / "assets/models/tiny-qwen2_5_vl"


def test_the_per_token_advantage_is_the_teachers_minus_the_students_log_prob() -> None:
    student = torch.tensor([[-1.0, -2.0, -0.5, -5.0]])
    teacher = torch.tensor([[-0.5, -1.0, -1.5, -1.0]])
    mask = torch.tensor([[1, 0, 1, 1]])
    # d = −(log π_S − log π_T) = [0.5, 1.0, −1.0, 4.0], 0 outside the mask
    assert distill_advantages(student, teacher, mask).tolist() == [[0.5, 0.0, -1.0, 4.0]]
    # γ = 0.5: A_3 = 4; A_2 = −1 + 0.5·4 = 1; A_1 masked: 0; A_0 = 0.5 + 0.5·1 (the masked
    # position between adds no discount) = 1.0
    assert distill_advantages(student, teacher, mask, 0.5).tolist() == [[1.0, 0.0, 1.0, 4.0]]
    assert distill_advantages(student, teacher, mask, 1.0).tolist() == [[3.5, 0.0, 3.0, 4.0]]
    with pytest.raises(ValueError, match="discount"):
        distill_advantages(student, teacher, mask, 1.5)


def test_the_surrogates_gradient_is_the_reverse_kl_estimators() -> None:
    """At the update (ratio 1) the clipped surrogate with A = d has the gradient
    ∂L/∂log π_S(y_t) = (log π_S − log π_T)(y_t) / N_tok: the REINFORCE gradient of
    KL(π_S ‖ π_T) on the sampled tokens."""
    torch.manual_seed(0)
    student = torch.randn(3, 5).clamp(max=0).requires_grad_(True)
    teacher = torch.randn(3, 5).clamp(max=0)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]]).float()
    advantage = distill_advantages(student.detach(), teacher, mask)
    loss, _ = grpo_loss(student, student.detach(), advantage, mask)
    loss.backward()
    expected = (student.detach() - teacher) * mask / mask.sum()
    torch.testing.assert_close(student.grad, expected)


def test_the_full_reverse_kl_equals_trls_gkd_at_beta_1() -> None:
    """``distill_loss: full`` with the token-mean aggregation is TRL's GKD loss with β = 1
    (reverse KL, masked positions left out): value and gradient on the same logits."""
    from trl.experimental.gkd.gkd_trainer import GKDTrainer

    torch.manual_seed(0)
    student = torch.randn(2, 4, 7, dtype=torch.float64, requires_grad=True)
    teacher = torch.randn(2, 4, 7, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.float64)
    labels = torch.where(mask > 0, 0, -100)
    theirs = GKDTrainer.generalized_jsd_loss(student, teacher, labels=labels, beta=1.0)
    (grad_theirs,) = torch.autograd.grad(theirs, student)
    kl = full_reverse_kl(student, teacher.log_softmax(-1))
    zero = torch.zeros(2)
    ours, _ = grpo_loss(torch.zeros(2, 4), torch.zeros(2, 4), zero, mask.float(), token_penalty=kl)
    (grad_ours,) = torch.autograd.grad(ours, student)
    torch.testing.assert_close(ours.double(), theirs)
    torch.testing.assert_close(grad_ours, grad_theirs)
    # a teacher with a larger output layer: its extra rows (padding no text uses) are left out
    wider = torch.cat([teacher, torch.full((2, 4, 3), -30.0, dtype=torch.float64)], dim=-1)
    torch.testing.assert_close(
        full_reverse_kl(student, wider.log_softmax(-1)), kl, atol=1e-9, rtol=1e-9
    )


@pytest.mark.parametrize("teacher_vocab", [7, 5, 9])
def test_the_full_kls_closed_form_gradient_is_the_derivative(teacher_vocab: int) -> None:
    """gradcheck of the hand-written backward, for a teacher vocabulary equal to, smaller than
    and larger than the student's (the KL sums over the shared ids)."""
    torch.manual_seed(1)
    student = torch.randn(2, 3, 7, dtype=torch.float64, requires_grad=True)
    teacher = torch.randn(2, 3, teacher_vocab, dtype=torch.float64).log_softmax(-1)
    assert torch.autograd.gradcheck(lambda z: full_reverse_kl(z, teacher), (student,))
    assert bool((full_reverse_kl(student, student.detach().log_softmax(-1)) == 0).all())


def _distill_run(tmp_path: Path, name: str, *extra: str):
    return load_config(
        REPO / "configs/demo.yaml",
        [
            *short_run(tmp_path, name, steps=2, group=4, new_tokens=6),
            *NO_EVAL,
            "train.threads=1",
            "checkpoint.every=1",
            "optim.weight_decay=0",
            f"teacher.path={MODEL}",
            *extra,
        ],
    )


def _metrics(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if '"train/reward"' in line]


def _weights(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    folder = run_dir / "checkpoints" / f"step-{step:06d}"
    return {k: v for f in folder.glob("*.safetensors") for k, v in load_file(f).items()}


@pytest.mark.parametrize("loss", ["sampled", "full"])
def test_a_teacher_equal_to_the_student_teaches_nothing(tmp_path: Path, loss: str) -> None:
    """Pure distillation (reward_coef 0) from the policy's own checkpoint: every advantage (or
    the full KL's gradient) is 0, the weights after two steps are the initial weights bit for
    bit, and the logs say the reverse KL is 0 and the teacher's argmax is measured."""
    cfg = _distill_run(
        tmp_path, "same", "algorithm.reward_coef=0", f"algorithm.distill_loss={loss}"
    )
    summary = train(cfg, verbose=False)
    run_dir = Path(summary["run_dir"])
    initial = {k: v for f in MODEL.glob("*.safetensors") for k, v in load_file(f).items()}
    after = _weights(run_dir, 2)
    assert after.keys() == initial.keys()
    assert all(torch.equal(after[k], initial[k]) for k in initial)
    for line in _metrics(run_dir):
        assert line["distill/reverse_kl"] == 0.0
        assert 0.0 <= line["distill/teacher_agree"] <= 1.0
        assert line["time/teacher_forward_s"] >= 0.0


@pytest.fixture(scope="module")
def other_teacher(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen2.5-VL of another seed: the student's tokenizer and processor, other weights."""
    return build_tiny("qwen2_5_vl", tmp_path_factory.mktemp("teacher") / "t", seed=11)


def test_another_teacher_moves_the_student_and_resumes_exactly(tmp_path, other_teacher) -> None:
    extra = (f"teacher.path={other_teacher}", "algorithm.reward_coef=0")
    full = Path(
        train(_distill_run(tmp_path, "full", *extra, "train.steps=3"), verbose=False)["run_dir"]
    )
    train(_distill_run(tmp_path, "cut", *extra, "train.steps=2"), verbose=False)
    cut = Path(
        train(_distill_run(tmp_path, "cut", *extra, "train.steps=3"), verbose=False)["run_dir"]
    )
    a, b = _metrics(full), _metrics(cut)
    assert [m["step"] for m in b] == [1, 2, 3]
    for x, y in zip(a, b):
        assert x["distill/reverse_kl"] > 0.01  # the student differs from the teacher
        assert x["distill/reverse_kl"] == pytest.approx(y["distill/reverse_kl"], abs=1e-6)
        assert x["train/reward"] == pytest.approx(y["train/reward"], abs=1e-6)
    initial = {k: v for f in MODEL.glob("*.safetensors") for k, v in load_file(f).items()}
    moved, resumed = _weights(full, 3), _weights(cut, 3)
    assert any(not torch.equal(moved[k], initial[k]) for k in initial)
    assert all(torch.equal(moved[k], resumed[k]) for k in moved)


def test_the_full_kl_moves_the_student_and_shares_the_packed_forward(
    tmp_path, other_teacher
) -> None:
    """``distill_loss: full``: the exact KL to another teacher is > 0 and logged with the
    teacher's time; group-shared and per-completion forwards give the same KL (the teacher's
    distributions are read in the policy's own row order)."""
    runs = {}
    for shared in ("true", "false"):
        cfg = _distill_run(
            tmp_path, f"full-{shared}", f"teacher.path={other_teacher}", "train.steps=1",
            "algorithm.distill_loss=full", "algorithm.reward_coef=0",
            f"rollout.group_shared={shared}",
        )  # fmt: skip
        run_dir = Path(train(cfg, verbose=False)["run_dir"])
        runs[shared] = _metrics(run_dir)[0]
        initial = {k: v for f in MODEL.glob("*.safetensors") for k, v in load_file(f).items()}
        after = _weights(run_dir, 1)
        assert any(not torch.equal(after[k], initial[k]) for k in initial)
    assert runs["true"]["distill/reverse_kl"] > 0.01
    assert runs["true"]["time/teacher_forward_s"] > 0
    for key in ("distill/reverse_kl", "distill/teacher_agree", "train/reward"):
        assert runs["true"][key] == pytest.approx(runs["false"][key], abs=1e-5), key


def test_the_group_shared_teacher_forward_equals_one_sequence_per_completion(
    tmp_path, other_teacher
) -> None:
    runs = {}
    for shared in ("true", "false"):
        cfg = _distill_run(
            tmp_path, f"shared-{shared}", f"teacher.path={other_teacher}", "train.steps=1",
            f"rollout.group_shared={shared}",
        )  # fmt: skip
        runs[shared] = _metrics(Path(train(cfg, verbose=False)["run_dir"]))[0]
    for key in ("distill/reverse_kl", "distill/teacher_agree", "train/reward"):
        assert runs["true"][key] == pytest.approx(runs["false"][key], abs=1e-5), key


def test_a_teacher_of_another_family_or_vocabulary_is_refused(tmp_path: Path) -> None:
    qwen3 = REPO / "assets/models/tiny-qwen3_vl"
    with pytest.raises(ConfigError, match=r"teacher.path: a qwen3_vl model.*qwen2_5_vl"):
        train(_distill_run(tmp_path, "family", f"teacher.path={qwen3}"), verbose=False)

    def policy(vocab: dict[str, int], patch: int = 14):
        tokenizer = SimpleNamespace(get_vocab=lambda: dict(vocab))
        return SimpleNamespace(
            tokenizer=tokenizer, image_processor=SimpleNamespace(patch_size=patch)
        )

    vocab = {"a": 0, "b": 1, "<|im_end|>": 2}
    check_teacher(policy(vocab), policy(vocab))
    with pytest.raises(ValueError, match=r"2 tokens have other ids, e.g. '<\|im_end\|>': 2 vs 1"):
        check_teacher(policy(vocab), policy({"a": 0, "b": 2, "<|im_end|>": 1}))
    with pytest.raises(ValueError, match=r"missing, e.g. '<\|im_end\|>'"):
        check_teacher(policy(vocab), policy({"a": 0, "b": 1}))
    with pytest.raises(ValueError, match=r"image_processor.patch_size is 16, the policy's 14"):
        check_teacher(policy(vocab), policy(vocab, patch=16))


def test_distillation_keys_are_checked_at_start_up() -> None:
    with pytest.raises(ConfigError, match="algorithm.distill_coef: must be > 0 with teacher.path"):
        load_config("demo", [f"teacher.path={MODEL}", "algorithm.distill_coef=0"])
    with pytest.raises(
        ConfigError, match="algorithm.reward_coef: .*without teacher.path it must be 1"
    ):
        load_config("demo", ["algorithm.reward_coef=0.5"])
    with pytest.raises(ConfigError, match=r"algorithm.distill_discount: must be in \[0, 1\]"):
        load_config("demo", [f"teacher.path={MODEL}", "algorithm.distill_discount=2"])
    with pytest.raises(ConfigError, match="algorithm.distill_discount: applies to distill_loss"):
        load_config(
            "demo",
            [
                f"teacher.path={MODEL}",
                "algorithm.distill_loss=full",
                "algorithm.distill_discount=0.5",
            ],
        )


def test_a_teacher_scores_rollouts_sampled_one_step_ahead(tmp_path, other_teacher) -> None:
    """Asynchronous rollouts (``rollout.max_staleness=1``): the teacher scores each batch at
    update time, whichever weights sampled it."""
    cfg = _distill_run(
        tmp_path, "ahead", f"teacher.path={other_teacher}", "rollout.max_staleness=1", "algorithm.tis_cap=2",
        "train.steps=3",
    )  # fmt: skip
    steps = _metrics(Path(train(cfg, verbose=False)["run_dir"]))
    assert [m["step"] for m in steps] == [1, 2, 3]
    assert all(m["distill/reverse_kl"] > 0.01 and "time/teacher_forward_s" in m for m in steps)
