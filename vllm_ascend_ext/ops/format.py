"""``torch_npu.npu_format_cast``: a tensor's physical format on the NPU (ND, FRACTAL_NZ).

Some operators take weights only in ``FRACTAL_NZ`` (ACL format 29), the NPU's tiled
matrix layout: ``npu_mla_prolog_v3``'s ``weight_dq``, ``weight_uq_qr`` and
``weight_dkv_kr`` ("数据格式支持FRACTAL_NZ（可通过torch_npu.npu_format_cast将ND格式转为
FRACTAL_NZ格式）"); others recommend it for quantized weights on A2/A3
(``quantization/weight_format.py``). The plugin casts them once after loading. On an
NPU that is torch_npu's cast (a new tensor in the tiled layout; ``torch_npu.get_npu_format``
reads it back). Elsewhere the format is a property only the NPU's memory has: the
reference returns a copy (a cast allocates on the NPU too, so what stays resident is
the same) with the same values and records the format on it, so the operators'
references compute the same numbers and contract mode checks the format the NPU would
see (``npu_format``). A tensor already in the asked format is returned as is.

``cast_parameter`` replaces a module's parameter by its cast: a new ``Parameter`` object
would drop the recorded format, so it is carried over.
"""

from __future__ import annotations

import torch

from vllm_ascend_ext.ops._dispatch import torch_npu_module
from vllm_ascend_ext.ops.counting import npu_op
from vllm_ascend_ext.ops.op_record import NpuOp

OP = "npu_format_cast"
ACL_FORMAT_ND = 2
ACL_FORMAT_FRACTAL_NZ = 29
FORMAT_NAMES = {ACL_FORMAT_ND: "ND", ACL_FORMAT_FRACTAL_NZ: "FRACTAL_NZ"}
_RECORDED = "_ascend_ext_npu_format"      # the emulated format, on the alias


def format_cast_reference(self: torch.Tensor, acl_format: int, *, customize_dtype=None,
                          input_dtype=None) -> torch.Tensor:
    if acl_format not in FORMAT_NAMES:
        raise ValueError(f"npu_format_cast: format {acl_format} is not emulated "
                         f"(known: {FORMAT_NAMES})")
    if npu_format(self) == acl_format:
        return self
    out = self.detach().clone()
    setattr(out, _RECORDED, int(acl_format))
    return out


def format_cast_meta(self, acl_format, *, customize_dtype=None, input_dtype=None):
    return format_cast_reference(self, acl_format)


def format_cast_npu(self, acl_format):
    return torch_npu_module().npu_format_cast(self, acl_format)


@npu_op(OP)
def npu_format_cast(self: torch.Tensor, acl_format: int) -> torch.Tensor:
    impl = FORMAT_CAST.pick(self.device)
    return impl(self, acl_format)


def npu_format(t: torch.Tensor) -> int:
    """The tensor's format: torch_npu's on an NPU, the recorded one elsewhere (ND if none)."""
    if t.device.type == "npu":
        import torch_npu

        return int(torch_npu.get_npu_format(t))
    return int(getattr(t, _RECORDED, ACL_FORMAT_ND))


def format_name(acl_format: int) -> str:
    return FORMAT_NAMES.get(acl_format, f"format {acl_format}")


def as_format(t: torch.Tensor, acl_format: int) -> torch.Tensor:
    """``t`` in ``acl_format``: itself when it already is, else its cast (a new tensor)."""
    return t if npu_format(t) == acl_format else npu_format_cast(t, acl_format)


def cast_parameter(module: torch.nn.Module, name: str, acl_format: int) -> None:
    """Replace ``module.<name>`` by its cast (nothing when it already has the format)."""
    param = getattr(module, name)
    if npu_format(param) == acl_format:
        return
    new = torch.nn.Parameter(npu_format_cast(param.data, acl_format), requires_grad=False)
    for key, value in vars(param).items():     # vLLM's weight attributes (loaders, dims)
        setattr(new, key, value)
    if new.device.type != "npu":
        setattr(new, _RECORDED, int(acl_format))
    setattr(module, name, new)


FORMAT_CAST = NpuOp(OP, npu=format_cast_npu, reference=format_cast_reference,
                    meta=format_cast_meta)
