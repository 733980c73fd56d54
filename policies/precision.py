"""Numerical precision of a policy's compute and weights (``precision=fp32|bf16``), and torch.compile of
its heavy forward (``compile=true``), for SFT, the RL learner and serving alike.

    p = policies.precision.lookup("bf16")       # unknown names are refused with the closest one
    p.cast_frozen(policy)                        # frozen matmul weights -> bfloat16; trainable ones stay fp32
    with p.autocast(policy.device):
        loss = policy.sft_loss(obs, actions)     # matmuls and convolutions in bfloat16
    with p.full_weights(policy):
        policies.save(policy, out)               # every tensor of the bundle in float32
    compile_policy(policy)                       # nn.Module.compile of the heavy submodules, or a warning

``bf16`` is mixed precision: the weights that train are float32 master weights (the optimizer steps on
them in float32), the forward runs under ``torch.autocast`` (bfloat16 matmuls, float32 reductions), and
the weights that do not train (a frozen VLM or vision backbone, RL's frozen prefix) are *held* in
bfloat16, which halves their memory. A bundle always stores float32 tensors: the trained weights as
trained, the frozen ones as their bfloat16 values, upcast exactly (rounded once, relative error at most
2^-8, when the cast happened). Normalisation layers keep float32 weights (their statistics are float32,
and torch's CPU LayerNorm refuses bfloat16 weights beside a float32 input).
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, ClassVar, Iterator

import torch
from torch import nn

from sims.registry import Registry

#: modules whose own weights a bfloat16 precision holds in bfloat16 when frozen: autocast runs their ops
#: (linear, convolution, attention projections) in bfloat16 anyway, and an embedding is a lookup
LOW_PRECISION_MODULES: tuple[type[nn.Module], ...] = (
    nn.Linear,
    nn.Conv1d,
    nn.Conv2d,
    nn.Conv3d,
    nn.Embedding,
    nn.MultiheadAttention,
)

#: submodules :func:`compile_policy` compiles, by the names the families give them: the multimodal prefix
#: and the action expert (flow), the prefix (autoregressive: its decoder steps token by token through a
#: KV cache and stays eager), the encoder and the denoiser (diffusion). A policy may name its own in a
#: ``compile_modules`` attribute.
COMPILE_MODULES = ("prefix", "expert", "encoder", "denoiser")


class Precision:
    """How a policy computes (:meth:`autocast`) and holds its frozen weights (:meth:`cast_frozen`).
    A subclass with a ``name`` registers itself in :data:`PRECISIONS`."""

    name: ClassVar[str] = ""
    #: the dtype of autocast's low-precision ops (float32: no autocast)
    compute_dtype: ClassVar[torch.dtype] = torch.float32
    #: the dtype of the frozen weights of :data:`LOW_PRECISION_MODULES`
    frozen_dtype: ClassVar[torch.dtype] = torch.float32

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not cls.name:
            raise TypeError(f"precision class {cls.__name__} must set 'name'")
        PRECISIONS.register(cls.name, cls())

    @contextlib.contextmanager
    def autocast(self, device: torch.device | str) -> Iterator[None]:
        """The context the forward (and the loss) runs in on ``device``. Under a low compute dtype the
        transformer layers' fused inference path is off, as CUDA autocast turns it off: on the CPU it would
        run inside a compiled graph without autocast's casts (fp32 inputs against bf16 weights)."""
        if self.compute_dtype == torch.float32:
            yield
            return
        fastpath = torch.backends.mha.get_fastpath_enabled()
        torch.backends.mha.set_fastpath_enabled(False)
        try:
            with torch.autocast(device_type=torch.device(device).type, dtype=self.compute_dtype):
                yield
        finally:
            torch.backends.mha.set_fastpath_enabled(fastpath)

    def cast_frozen(self, module: nn.Module) -> list[str]:
        """Hold the frozen weights (``requires_grad`` False) of ``module``'s :data:`LOW_PRECISION_MODULES`
        in :attr:`frozen_dtype`, in place; the names of the parameters cast. Call it after whatever
        freezes parameters (SFT: the model's own ``train_expert_only``; RL: ``freeze_prefix``) and before
        the optimizer is built."""
        if self.frozen_dtype == torch.float32:
            return []
        cast = []
        for prefix, sub in module.named_modules():
            if not isinstance(sub, LOW_PRECISION_MODULES):
                continue
            for name, p in sub.named_parameters(recurse=False):
                if not p.requires_grad and p.is_floating_point() and p.dtype != self.frozen_dtype:
                    p.data = p.data.to(self.frozen_dtype)
                    cast.append(f"{prefix}.{name}" if prefix else name)
        return cast

    @contextlib.contextmanager
    def full_weights(self, module: nn.Module) -> Iterator[nn.Module]:
        """Inside the block every floating-point parameter of ``module`` is float32 (:func:`to_float32`),
        after it back as it was: save bundles inside it."""
        low = to_float32(module)
        try:
            yield module
        finally:
            for p, dtype in low:
                p.data = p.data.to(dtype)

    def for_inference(self, policy: nn.Module) -> nn.Module:
        """``policy`` made ready to serve under :meth:`autocast`: eval mode, and with a low frozen dtype
        every weight frozen and held in it (nothing trains while serving)."""
        policy.eval()
        if self.frozen_dtype != torch.float32:
            policy.requires_grad_(False)
            self.cast_frozen(policy)
        return policy


def to_float32(module: nn.Module) -> list[tuple[nn.Parameter, torch.dtype]]:
    """Every floating-point parameter of ``module`` in float32, in place (a bfloat16 one upcast exactly);
    the parameters changed and their dtypes before."""
    low = [(p, p.dtype) for p in module.parameters() if p.is_floating_point() and p.dtype != torch.float32]
    for p, _ in low:
        p.data = p.data.float()
    return low


#: the precisions by name
PRECISIONS: Registry[Precision] = Registry("precision")


class FP32(Precision):
    """Everything in float32: the reference numerics."""

    name = "fp32"


class BF16(Precision):
    """bfloat16 autocast, float32 master weights, bfloat16 frozen weights (see the module docstring)."""

    name = "bf16"
    compute_dtype = torch.bfloat16
    frozen_dtype = torch.bfloat16


def lookup(name: str) -> Precision:
    """The registered precision ``name``; ``ValueError`` naming the closest one otherwise."""
    return PRECISIONS.lookup(name)


_COMPILE_PROBLEMS: dict[str, str | None] = {}


def compile_problem(device: torch.device | str) -> str | None:
    """Why torch.compile cannot run on ``device``'s type here (None when it can): a tiny function is
    compiled and run once per device type (Inductor's C++ or Triton toolchain, Dynamo's Python)."""
    kind = torch.device(device).type
    if kind not in _COMPILE_PROBLEMS:
        try:
            if not torch._dynamo.is_dynamo_supported():
                raise RuntimeError(f"Dynamo does not support this Python ({torch.__version__})")
            probe = torch.compile(lambda x: torch.tanh(x) * 2.0 + 1.0, dynamic=False)
            probe(torch.zeros(4, device=kind))
            _COMPILE_PROBLEMS[kind] = None
        except Exception as err:  # noqa: BLE001  (any toolchain failure means: run eagerly)
            _COMPILE_PROBLEMS[kind] = f"{type(err).__name__}: {str(err).strip().splitlines()[0][:300]}"
        finally:
            torch._dynamo.reset()
    return _COMPILE_PROBLEMS[kind]


def compile_policy(policy: nn.Module) -> list[str]:
    """Compile ``policy``'s heavy submodules in place (``nn.Module.compile``: the state dict keeps its
    names, so bundles and weight syncs are unchanged) and return their names. Where torch.compile cannot
    run (:func:`compile_problem`) nothing is compiled and a ``RuntimeWarning`` says why: the policy then
    runs eagerly, with the same numerics."""
    names = list(getattr(policy, "compile_modules", None) or COMPILE_MODULES)
    names = [n for n in names if isinstance(getattr(policy, n, None), nn.Module)]
    device = next(policy.parameters()).device
    if not names:
        warnings.warn(
            f"compile=true: the {getattr(policy, 'family', type(policy).__name__)} policy has none of the "
            f"submodules {list(COMPILE_MODULES)} (set its compile_modules); it runs eagerly",
            RuntimeWarning,
            stacklevel=2,
        )
        return []
    problem = compile_problem(device)
    if problem is not None:
        warnings.warn(
            f"compile=true: torch.compile does not run on {device.type} here ({problem}); the policy runs "
            "eagerly (install a C++ compiler for the CPU, or Triton for CUDA, to compile)",
            RuntimeWarning,
            stacklevel=2,
        )
        return []
    for name in names:
        getattr(policy, name).compile()
    return names
