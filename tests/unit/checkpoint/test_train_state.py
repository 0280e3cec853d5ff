"""TrainState's learned names: the same state dict as torch's get_state_dict, and a fall back to it
whenever the model or optimizer changes shape."""

from __future__ import annotations

import torch
from torch.distributed.checkpoint.state_dict import get_state_dict

from stalwart.checkpoint import TrainState
from stalwart.checkpoint.adapters import _same


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2))
        self.head = torch.nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def _train(model: torch.nn.Module, optim: torch.optim.Optimizer) -> None:
    optim.zero_grad()
    model(torch.randn(5, 4)).sum().backward()
    optim.step()


def _reference(model: torch.nn.Module, optim: torch.optim.Optimizer) -> dict[str, object]:
    model_sd, optim_sd = get_state_dict(model, [optim])
    return {"model": model_sd, "optim": optim_sd}


def test_learned_names_give_get_state_dicts_entries() -> None:
    torch.manual_seed(0)
    model = Net()
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
    state = TrainState(model, optim)
    _train(model, optim)
    first = state.state_dict()  # learns
    assert state._names is not None
    for _ in range(3):
        _train(model, optim)
        optim.param_groups[0]["lr"] *= 0.5  # a scheduler's change shows in the next state dict
        fast = state.state_dict()
        assert _same(fast, _reference(model, optim))
    assert fast["optim"]["param_groups"][0]["lr"] != first["optim"]["param_groups"][0]["lr"]


def test_a_new_parameter_group_falls_back_and_learns_again() -> None:
    torch.manual_seed(0)
    model = Net()
    optim = torch.optim.SGD(model.body.parameters(), lr=0.1, momentum=0.9)
    state = TrainState(model, optim)
    _train(model, optim)
    state.state_dict()
    optim.add_param_group({"params": list(model.head.parameters()), "lr": 0.01})
    _train(model, optim)
    assert _same(state.state_dict(), _reference(model, optim))
    _train(model, optim)
    assert _same(state.state_dict(), _reference(model, optim))


def test_an_optimizer_without_state_yet_takes_get_state_dict() -> None:
    model = Net()
    optim = torch.optim.AdamW(model.parameters())
    state = TrainState(model, optim)
    sd = state.state_dict()  # get_state_dict creates the moments (a zero step) before saving them
    assert all("exp_avg" in per_param for per_param in sd["optim"]["state"].values())
    assert _same(state.state_dict(), _reference(model, optim))


def test_model_only() -> None:
    model = Net()
    state = TrainState(model)
    state.state_dict()
    assert _same(state.state_dict(), {"model": get_state_dict(model, [])[0]})
