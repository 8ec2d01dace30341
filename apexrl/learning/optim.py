"""Adam for the learners, without ``torch.optim.Optimizer``.

``torch.optim.Optimizer`` (torch >= 2.x) wraps its constructor and ``step`` in dynamo guards that
import ``torch._dynamo`` and ``torch._inductor`` on first use: seconds of CPU before a learner's
first update (2-5 s on a loaded 2-core box), for a compiler the learner never uses. ``Adam`` keeps
the same moments and step counts and calls torch's own functional ``torch.optim.adam.adam`` (the
fused kernel on CPU and CUDA, the multi-tensor one elsewhere), which imports no compiler. Its
``state_dict`` has ``torch.optim.Adam``'s layout, so checkpoints written with either load in the
other.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch.optim.adam import adam

BETAS = (0.9, 0.999)  # Adam's defaults (Kingma & Ba 2015), as torch.optim.Adam's


class Adam:
    """Adam over one list of parameters with a fixed learning rate and no weight decay.

    A parameter without a gradient is left as it is and its step count does not move, as in
    ``torch.optim.Adam``; ``step`` with no gradient at all changes nothing.
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor],
        lr: float,
        eps: float = 1e-8,
        betas: tuple[float, float] = BETAS,
    ) -> None:
        self.params = list(params)
        if not self.params:
            raise ValueError("Adam got no parameters")
        self.lr, self.eps, self.betas = lr, eps, betas
        # The fused kernel updates every parameter in one call: about 15 % off a CartPole update
        # on CPU, where a per-tensor loop is a large share of the step.
        self.fused = all(p.device.type in ("cpu", "cuda") for p in self.params)
        self.exp_avg = [torch.zeros_like(p) for p in self.params]
        self.exp_avg_sq = [torch.zeros_like(p) for p in self.params]
        self.steps = [torch.zeros((), dtype=torch.float32, device=p.device) for p in self.params]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    @torch.no_grad()
    def step(self) -> None:
        """One Adam step of every parameter that has a gradient."""
        have = [i for i, p in enumerate(self.params) if p.grad is not None]
        if not have:
            return
        adam(
            [self.params[i] for i in have],
            [self.params[i].grad for i in have],
            [self.exp_avg[i] for i in have],
            [self.exp_avg_sq[i] for i in have],
            [],
            [self.steps[i] for i in have],
            foreach=None if self.fused else True,
            fused=self.fused or None,
            amsgrad=False,
            beta1=self.betas[0],
            beta2=self.betas[1],
            lr=self.lr,
            weight_decay=0.0,
            eps=self.eps,
            maximize=False,
        )

    def state_dict(self) -> dict[str, object]:
        """``torch.optim.Adam.state_dict``'s layout: per-parameter state keyed by index (only
        parameters that were stepped) and one parameter group."""
        state = {
            i: {"step": step.clone(), "exp_avg": m.clone(), "exp_avg_sq": v.clone()}
            for i, (step, m, v) in enumerate(
                zip(self.steps, self.exp_avg, self.exp_avg_sq, strict=True)
            )
            if step.item() > 0
        }
        group = {
            "lr": self.lr,
            "betas": self.betas,
            "eps": self.eps,
            "weight_decay": 0.0,
            "amsgrad": False,
            "maximize": False,
            "foreach": None,
            "capturable": False,
            "differentiable": False,
            "fused": self.fused or None,
            "decoupled_weight_decay": False,
            "params": list(range(len(self.params))),
        }
        return {"state": state, "param_groups": [group]}

    def load_state_dict(self, state_dict: dict[str, object]) -> None:
        """Moments and step counts from ``state_dict`` (this class's or ``torch.optim.Adam``'s);
        the hyperparameters stay the config's. Raises ``ValueError`` when it describes other
        parameters."""
        groups = state_dict["param_groups"]
        indices = [i for group in groups for i in group["params"]]
        if sorted(indices) != list(range(len(self.params))):
            raise ValueError(
                f"the optimizer state holds {len(indices)} parameters, this network "
                f"{len(self.params)}"
            )
        states = state_dict["state"]
        moments = []
        for i, p in enumerate(self.params):
            s = states.get(i)
            if s is None:
                moments.append((torch.zeros(()), torch.zeros_like(p), torch.zeros_like(p)))
                continue
            if s["exp_avg"].shape != p.shape or s["exp_avg_sq"].shape != p.shape:
                raise ValueError(
                    f"the optimizer state of parameter {i} has shape "
                    f"{tuple(s['exp_avg'].shape)}, the parameter {tuple(p.shape)}"
                )
            moments.append((torch.as_tensor(s["step"]), s["exp_avg"], s["exp_avg_sq"]))
        for i, (p, (step, m, v)) in enumerate(zip(self.params, moments, strict=True)):
            self.steps[i] = step.to(device=p.device, dtype=torch.float32).clone()
            self.exp_avg[i] = m.to(device=p.device, dtype=p.dtype).clone()
            self.exp_avg_sq[i] = v.to(device=p.device, dtype=p.dtype).clone()
