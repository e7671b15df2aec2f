"""AdamW parameter groups and the LR schedule, checked against a table computed by hand."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from trainer.optim import (
    apply_scheduled_lr,
    build_lr_scheduler,
    build_optimizer,
    load_schedule_position,
    lr_at,
    step_unless_non_finite,
)

# lr=1.0, min_lr=0.1, warmup 4 steps, max 12 steps (decay over steps 5..12, progress = (n-4)/8).
# cos(pi/4) = 0.70710678: cosine at progress 0.25 = 0.1 + 0.9 * 0.85355339 = 0.86819805,
# at 0.75 = 0.1 + 0.9 * 0.14644661 = 0.23180195.
SCHEDULE_TABLE = [
    # (decay_style, warmup, max_steps, step n, expected lr)
    ("cosine", 4, 12, 1, 0.25),
    ("cosine", 4, 12, 2, 0.5),
    ("cosine", 4, 12, 4, 1.0),
    ("cosine", 4, 12, 6, 0.86819805),
    ("cosine", 4, 12, 8, 0.55),
    ("cosine", 4, 12, 10, 0.23180195),
    ("cosine", 4, 12, 12, 0.1),
    ("cosine", 4, 12, 20, 0.1),
    ("linear", 4, 12, 3, 0.75),
    ("linear", 4, 12, 5, 0.8875),
    ("linear", 4, 12, 6, 0.775),
    ("linear", 4, 12, 8, 0.55),
    ("linear", 4, 12, 10, 0.325),
    ("linear", 4, 12, 12, 0.1),
    ("constant", 4, 12, 2, 0.5),
    ("constant", 4, 12, 5, 1.0),
    ("constant", 4, 12, 12, 1.0),
    ("cosine", 0, 4, 1, 0.86819805),
    ("cosine", 0, 4, 4, 0.1),
    ("linear", 0, 4, 2, 0.55),
    ("linear", 4, 4, 4, 1.0),
]


@pytest.mark.parametrize(("style", "warmup", "max_steps", "step", "expected"), SCHEDULE_TABLE)
def test_lr_at_matches_table(style, warmup, max_steps, step, expected):
    got = lr_at(
        step, warmup_steps=warmup, max_steps=max_steps, decay_style=style, lr=1.0, min_lr=0.1
    )
    assert got == pytest.approx(expected, abs=1e-7)


@pytest.mark.parametrize("style", ["cosine", "linear", "constant"])
def test_scheduler_drives_optimizer_lr_per_table(style):
    """The LR the optimizer actually uses at step n is the table's value for n."""
    model = nn.Linear(3, 3)
    opt = build_optimizer(model, lr=1.0, weight_decay=0.1, beta1=0.9, beta2=0.95)
    sched = build_lr_scheduler(
        opt, warmup_steps=4, max_steps=12, decay_style=style, lr=1.0, min_lr=0.1
    )
    expected = {n: lr for (s, w, m, n, lr) in SCHEDULE_TABLE if (s, w, m) == (style, 4, 12)}
    seen = {}
    for n in range(1, 13):
        seen[n] = opt.param_groups[0]["lr"]
        assert all(g["lr"] == seen[n] for g in opt.param_groups)
        opt.step()
        sched.step()
    for n, lr in expected.items():
        if n <= 12:
            assert seen[n] == pytest.approx(lr, abs=1e-7), n


def test_scheduler_state_resumes_at_same_lr():
    def make():
        model = nn.Linear(2, 2)
        opt = build_optimizer(model, lr=1.0, weight_decay=0.0, beta1=0.9, beta2=0.95)
        return opt, build_lr_scheduler(
            opt, warmup_steps=4, max_steps=12, decay_style="cosine", lr=1.0, min_lr=0.1
        )

    opt, sched = make()
    for _ in range(5):
        opt.step()
        sched.step()
    state = sched.state_dict()
    assert state["last_epoch"] == 5
    opt2, sched2 = make()
    sched2.load_state_dict(state)
    # LambdaLR alone leaves the fresh optimizer at its construction-time lr...
    assert opt2.param_groups[0]["lr"] == pytest.approx(0.25)
    apply_scheduled_lr(sched2)
    # ...so the 6th step would not use the table's value for n=6 without apply_scheduled_lr.
    assert sched2.get_last_lr()[0] == pytest.approx(0.86819805, abs=1e-7)
    assert opt2.param_groups[0]["lr"] == pytest.approx(opt.param_groups[0]["lr"], abs=1e-12)


def test_load_schedule_position_keeps_the_current_base_lr():
    """Step count from the saved state, base LR from the current flags (a resume with --lr)."""
    model = nn.Linear(2, 2)
    opt = build_optimizer(model, lr=1.0, weight_decay=0.0, beta1=0.9, beta2=0.95)
    sched = build_lr_scheduler(
        opt, warmup_steps=4, max_steps=12, decay_style="linear", lr=1.0, min_lr=0.1
    )
    for _ in range(5):
        opt.step()
        sched.step()
    state = sched.state_dict()

    opt2 = build_optimizer(model, lr=2.0, weight_decay=0.0, beta1=0.9, beta2=0.95)
    sched2 = build_lr_scheduler(
        opt2, warmup_steps=4, max_steps=12, decay_style="linear", lr=2.0, min_lr=0.2
    )
    load_schedule_position(sched2, state)
    assert sched2.last_epoch == 5
    # Step n=6 of the new schedule: twice the table's 0.775.
    assert opt2.param_groups[0]["lr"] == pytest.approx(1.55)


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.proj = nn.Linear(4, 4, bias=True)
        self.norm = nn.LayerNorm(4)
        self.rms = nn.RMSNorm(4)
        self.scale = nn.Parameter(torch.ones(4))  # 1-D, name without "norm"/"bias"
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight  # tied
        self.frozen = nn.Linear(4, 4)
        self.frozen.requires_grad_(False)


def test_param_groups_decay_only_matrices():
    model = _Block()
    opt = build_optimizer(model, lr=1e-3, weight_decay=0.1, beta1=0.9, beta2=0.95)
    decay_group, no_decay_group = opt.param_groups
    assert decay_group["weight_decay"] == 0.1
    assert no_decay_group["weight_decay"] == 0.0
    ids = {id(p): n for n, p in model.named_parameters()}
    assert sorted(ids[id(p)] for p in decay_group["params"]) == ["embed.weight", "proj.weight"]
    assert sorted(ids[id(p)] for p in no_decay_group["params"]) == [
        "norm.bias",
        "norm.weight",
        "proj.bias",
        "rms.weight",
        "scale",
    ]


def test_fused_is_the_default_on_cpu_and_can_be_forced_off():
    """On the CPU too (offloaded shards, CPU runs): the path a GPU run takes, skips included."""
    model = nn.Linear(2, 2)
    opt = build_optimizer(model, lr=1e-3, weight_decay=0.0, beta1=0.9, beta2=0.95)
    assert opt.defaults["fused"]
    opt = build_optimizer(model, lr=1e-3, weight_decay=0.0, beta1=0.9, beta2=0.95, fused=False)
    assert not opt.defaults["fused"]
    # No kernel for parameters split across device types: the default implementation then.
    model.bias = nn.Parameter(torch.zeros(2, device="meta"))
    opt = build_optimizer(model, lr=1e-3, weight_decay=0.0, beta1=0.9, beta2=0.95)
    assert not opt.defaults["fused"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"decay_style": "exp"}, "decay_style must be one of"),
        ({"warmup_steps": 13}, "warmup_steps must be in"),
        ({"max_steps": 0}, "max_steps must be >= 1"),
        ({"min_lr": 2.0}, "min_lr must be in"),
        ({"lr": 0.5}, "differs from the schedule's lr"),
    ],
)
def test_scheduler_rejects_bad_settings(kwargs, message):
    opt = build_optimizer(nn.Linear(2, 2), lr=1.0, weight_decay=0.0, beta1=0.9, beta2=0.95)
    settings = {
        "warmup_steps": 4,
        "max_steps": 12,
        "decay_style": "cosine",
        "lr": 1.0,
        "min_lr": 0.1,
    } | kwargs
    with pytest.raises(ValueError, match=message):
        build_lr_scheduler(opt, **settings)


def test_optimizer_rejects_bad_beta():
    with pytest.raises(ValueError, match="beta2 must be in"):
        build_optimizer(nn.Linear(2, 2), lr=1e-3, weight_decay=0.0, beta1=0.9, beta2=1.0)


@pytest.mark.parametrize("fused", [True, False])
def test_a_non_finite_norm_skips_the_whole_update(fused: bool) -> None:
    """Fused AdamW skips inside its kernel (no host sync) and restores its step count; the
    other implementations skip on the host. Either way nothing moves, and a finite norm
    steps as usual."""
    torch.manual_seed(0)
    model = nn.Linear(4, 4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1, fused=fused)
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()  # moments and step counts exist
    before = [p.detach().clone() for p in model.parameters()]
    state = [{k: v.clone() for k, v in optimizer.state[p].items()} for p in model.parameters()]

    skipped = step_unless_non_finite(optimizer, torch.tensor(float("nan")))
    assert skipped.item() == 1.0
    assert not hasattr(optimizer, "found_inf")
    for param, old, old_state in zip(model.parameters(), before, state, strict=True):
        assert torch.equal(param, old)
        for key, value in optimizer.state[param].items():
            assert torch.equal(value, old_state[key]), key

    assert step_unless_non_finite(optimizer, torch.tensor(1.0)).item() == 0.0
    assert not torch.equal(next(model.parameters()), before[0])
    assert optimizer.state[next(model.parameters())]["step"].item() == 2
