"""Checkpoints of weights gathered in float8: what DCP sees is the weights' values, staged
into reused buffers, written without torchao's classes, and loaded back into the parameters.

With float8 all-gather (tensorwise over a shard group) each converted weight's shard is
torchao's ``WeightWithDynamicFloat8CastTensor``, a wrapper without storage of its own
(trainer.float8 ``plain_float8_weights`` says what that did to checkpoints). FSDP2 over a
one-rank gloo group keeps the wrapper as it does over several ranks, so these run in-process.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from trainer.checkpoint import CheckpointManager, checkpoint_state
from trainer.checkpoint_upload import StagingBuffers
from trainer.float8 import Float8Plan, convert_to_float8

GATHERED_IN_FLOAT8 = Float8Plan(recipe="tensorwise", emulate=True, all_gather=True)


def _sharded_model(seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Linear(32, 48, bias=False), nn.GELU(), nn.Linear(48, 32, bias=False), nn.GELU()
    )
    convert_to_float8(model, GATHERED_IN_FLOAT8)
    fully_shard(model, mesh=init_device_mesh("cpu", (1,)))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def _train_step(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    model(torch.randn(4, 32)).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad()


def _weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """Each parameter's values: the tensor inside torchao's wrapper (its ``_tensor``)."""
    values = {}
    for name, param in model.named_parameters():
        local = param.to_local() if isinstance(param, DTensor) else param
        values[name] = getattr(local, "_tensor", local).detach().clone()
    return values


def _local(value: Any) -> torch.Tensor:
    local = value.to_local() if isinstance(value, DTensor) else value
    assert type(local) is torch.Tensor, type(local)  # no torchao class reaches DCP
    return local


def test_the_sharded_weights_really_are_torchao_s_wrapper(gloo_world_of_one: None) -> None:
    """The premise of the tests below: without it they would prove nothing."""
    from torchao.float8.fsdp_utils import WeightWithDynamicFloat8CastTensor

    model, _ = _sharded_model(seed=0)
    for param in model.parameters():
        assert isinstance(param, DTensor)
        assert isinstance(param.to_local(), WeightWithDynamicFloat8CastTensor)
        assert param.to_local().data_ptr() == 0  # no storage of its own


def test_staging_copies_the_weights_values_into_buffers_it_reuses(gloo_world_of_one: None) -> None:
    """torch's stager (``StateDictStager._offload_tensor``) copies a tensor without storage
    through ``new_empty``, which torchao's wrapper does not keep: staged as they are, the
    weights were uninitialised memory, and each save allocated them afresh."""
    model, optimizer = _sharded_model(seed=0)
    stager = StagingBuffers(pinned=False, shared=False)
    try:
        for save in range(2):
            _train_step(model, optimizer)
            expected = _weights(model)
            staged = stager.stage(checkpoint_state(model, optimizer, None))
            for name, values in expected.items():
                assert torch.equal(_local(staged["model"][name]), values), (save, name)
            moments = staged["optimizer"]["state"]
            assert all(_local(moments[name]["exp_avg"]).abs().sum() > 0 for name in expected)
            if save:  # the first save allocated the buffers; later ones copy into them
                assert stager.new_buffers == 0
    finally:
        stager.close()


def test_a_blocking_save_holds_plain_tensors_and_loads_back_into_the_parameters(
    gloo_world_of_one: None, tmp_path: Path
) -> None:
    """A synchronous save pickled torchao's wrapper class, which ``torch.load(weights_only=
    True)`` (DCP's ``FileSystemReader.read_data``) reads only where torchao registered it as
    safe. Loading writes through the plain DTensor into the wrapped parameters."""
    saved, optimizer = _sharded_model(seed=0)
    _train_step(saved, optimizer)
    manager = CheckpointManager(tmp_path / "ckpt", keep_last=0)
    location = manager.save(
        1, model=saved, optimizer=optimizer, lr_scheduler=None, train_state={"step": 1}
    )
    shards = sorted(Path(location).glob("*.distcp"))
    assert shards
    for shard in shards:
        assert b"torchao" not in shard.read_bytes(), shard

    loaded, fresh_optimizer = _sharded_model(seed=1)
    assert not torch.equal(_weights(loaded)["0.weight"], _weights(saved)["0.weight"])
    manager.load(location, model=loaded, optimizer=fresh_optimizer, lr_scheduler=None)
    for name, values in _weights(saved).items():
        assert torch.equal(_weights(loaded)[name], values), name
