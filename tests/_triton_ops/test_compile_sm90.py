"""Every Triton kernel compiles to an sm_90 (H100 / H200) cubin with the configs it launches
with, checked without a GPU: triton's compiler and its bundled ptxas need none. This
catches what the interpreter cannot (types the compiler rejects, shared memory past the
GPU's), not wrong results."""

import os

import pytest
import torch

triton = pytest.importorskip("triton")

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from pagedllm._triton_ops.activation import GELU_FORMS, SILU, act_and_mul_kernel  # noqa: E402
from pagedllm._triton_ops.fused_moe import fused_moe_kernel  # noqa: E402
from pagedllm._triton_ops.fused_moe_configs import _TUNED, MoEConfig, get_default_config  # noqa: E402
from pagedllm._triton_ops.layernorm import rms_norm_kernel  # noqa: E402
from pagedllm._triton_ops.moe_align_block_size import moe_align_block_size_kernel  # noqa: E402
from pagedllm._triton_ops.rotary import rotary_embedding_kernel  # noqa: E402
from pagedllm._triton_ops.topk_softmax import topk_softmax_kernel  # noqa: E402

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") == "1", reason="the interpreter compiles nothing"
)

H200 = GPUTarget("cuda", 90, 32)
H200_SHARED_MEMORY = 227 * 1024  # per block, opt-in maximum


def compile_sm90(
    kernel,
    pointers: dict[str, str],
    constexprs: dict,
    scalars: dict | None = None,
    divisible: frozenset[str] = frozenset(),
    **options: int,
):
    """Arguments named *_ptr are pointers of `pointers`' types (default `*i32`), the others
    of `scalars`' types, else 32-bit ints, unless given in `constexprs`; those in
    `divisible` are known to be multiples of 16, as Triton specializes a launch's aligned
    pointers and sizes (which turns on its pipelined copies and so sets the shared memory
    the kernel needs at run time; a launch also makes arguments equal to 1 constexprs)."""
    scalars = scalars or {}
    signature = {
        name: "constexpr"
        if name in constexprs
        else pointers.get(name, "*i32")
        if name.endswith("_ptr")
        else scalars.get(name, "i32")
        for name in kernel.arg_names
    }
    attrs = {
        (i,): [["tt.divisibility", 16]]
        for i, name in enumerate(kernel.arg_names)
        if name in divisible and name not in constexprs
    }
    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    compiled = triton.compile(source, target=H200, options=options)
    assert compiled.metadata.shared <= H200_SHARED_MEMORY
    return compiled


def moe_configs() -> list[tuple[str, MoEConfig]]:
    """vLLM's default rule's two shapes in bf16, its small one in float32 (IEEE products),
    and every distinct config of the table."""
    defaults = [("bf16", get_default_config(m, 128, torch.bfloat16)) for m in (1, 1024)]
    tuned = {tuple(sorted(c.items())) for row in _TUNED.values() for c in row.values()}
    table = [("bf16", dict(config)) for config in sorted(tuned)]
    return [*defaults, ("fp32", get_default_config(1, 128, torch.float32)), *table]


# What a launch on a model's shapes specializes: every pointer and the sizes and row strides
# of hidden sizes that are multiples of 16 are aligned, and the unit strides are constexprs.
MOE_DIVISIBLE = frozenset(
    ["a_ptr", "b_ptr", "c_ptr", "topk_weights_ptr", "sorted_token_ids_ptr", "expert_ids_ptr"]
    + ["num_tokens_post_padded_ptr", "N", "K", "stride_am", "stride_be", "stride_bn", "stride_cm"]
)
MOE_UNIT_STRIDES = {"stride_ak": 1, "stride_bk": 1, "stride_cn": 1}


@pytest.mark.parametrize("dtype, config", moe_configs())
def test_fused_moe_kernel(dtype: str, config: MoEConfig) -> None:
    """As launched: the shared memory checked is what the pipelined copies need."""
    element = f"*{dtype}"
    meta = {k: v for k, v in config.items() if k.startswith(("BLOCK", "GROUP"))}
    precision = "ieee" if dtype == "fp32" else "tf32"
    constexprs = dict(meta, MUL_ROUTED_WEIGHT=True, top_k=8, DOT_PRECISION=precision, WIDEN=False)
    constexprs |= MOE_UNIT_STRIDES
    pointers = {name: element for name in ("a_ptr", "b_ptr", "c_ptr", "topk_weights_ptr")}
    options = {k: config[k] for k in ("num_warps", "num_stages") if k in config}
    compiled = compile_sm90(
        fused_moe_kernel, pointers, constexprs, divisible=MOE_DIVISIBLE, **options
    )
    if config.get("num_stages", 2) > 2 and dtype == "bf16":  # the specialization took hold
        tile = config["BLOCK_SIZE_M"] + config["BLOCK_SIZE_N"]
        assert compiled.metadata.shared >= 2 * tile * config["BLOCK_SIZE_K"] * 2


def test_moe_align_block_size_kernel() -> None:
    constexprs = {"BLOCK_SIZE_M": 16, "EXPERTS": 128, "CHUNK": 1024, "HAS_EXPERT_MAP": True}
    pointers = {"topk_ids_ptr": "*i64", "expert_map_ptr": "*i64"}
    compile_sm90(moe_align_block_size_kernel, pointers, constexprs)


@pytest.mark.parametrize("activation", [SILU, *GELU_FORMS.values()])
def test_act_and_mul_kernel(activation: int) -> None:
    pointers = {"x_ptr": "*bf16", "out_ptr": "*bf16"}
    compile_sm90(act_and_mul_kernel, pointers, {"ACTIVATION": activation, "BLOCK": 1024})


def launch_keys(kernel, varying: dict[str, list[int]]) -> set[tuple]:
    """The specialization part of the cache key of `kernel`'s launches (what a new compile
    is made for), over launches that differ only in `varying`'s int arguments: values 1, a
    multiple of 16 and neither, which Triton would otherwise compile a variant for each of."""
    from triton.backends.compiler import BaseBackend
    from triton.runtime.jit import create_function_from_signature

    bind = create_function_from_signature(kernel.signature, kernel.params, BaseBackend)
    base = {p.name: torch.zeros(4) if p.name.endswith("_ptr") else 3 for p in kernel.params}
    keys = set()
    for values in zip(*varying.values(), strict=True):
        _, specialization, _ = bind(**base | dict(zip(varying, values, strict=True)))
        keys.add(tuple(map(str, specialization)))
    return keys


@pytest.mark.parametrize(
    "kernel, varying",
    [
        ("attention", {"num_seqs": [1, 16, 7], "stride_block_table": [1, 64, 5]}),
        ("fused_moe", {"num_blocks": [1, 32, 9], "num_valid_tokens": [1, 2048, 24]}),
        ("moe_align", {"num_assignments": [1, 1024, 24], "num_blocks": [1, 32, 9]}),
    ],
)
def test_the_counts_a_step_changes_compile_no_new_kernel(kernel: str, varying: dict) -> None:
    """Reference: one key. The batch's size, its block tables' width and the MoE's token
    counts change from step to step; a kernel specialized on them would be compiled anew
    in the middle of a run (seconds each, inside a benchmark's timed steps)."""
    from pagedllm._triton_ops.unified_attention import _attention_kernel

    kernels = {
        "attention": _attention_kernel,
        "fused_moe": fused_moe_kernel,
        "moe_align": moe_align_block_size_kernel,
    }
    assert len(launch_keys(kernels[kernel], varying)) == 1


@pytest.mark.parametrize("has_residual, block, num_warps", [(True, 4096, 16), (False, 1024, 4)])
def test_rms_norm_kernel(has_residual: bool, block: int, num_warps: int) -> None:
    pointers = dict.fromkeys(
        ("x_ptr", "residual_ptr", "weight_ptr", "out_ptr", "residual_out_ptr"), "*bf16"
    )
    compile_sm90(
        rms_norm_kernel,
        pointers,
        {"HAS_RESIDUAL": has_residual, "BLOCK": block},
        scalars={"eps": "fp32"},
        num_warps=num_warps,
    )


@pytest.mark.parametrize(
    "is_neox, head_size, rotary_dim, qk_norm", [(True, 128, 128, True), (False, 80, 64, False)]
)
def test_rotary_embedding_kernel(
    is_neox: bool, head_size: int, rotary_dim: int, qk_norm: bool
) -> None:
    pointers = {
        "positions_ptr": "*i64",
        "query_ptr": "*bf16",
        "key_ptr": "*bf16",
        "cos_sin_ptr": "*fp32",
        "query_out_ptr": "*bf16",
        "key_out_ptr": "*bf16",
        "q_weight_ptr": "*bf16",
        "k_weight_ptr": "*bf16",
    }
    constexprs = dict(
        NUM_HEADS=32,
        NUM_KV_HEADS=8,
        HEADS_PADDED=32,
        KV_HEADS_PADDED=8,
        HEAD_SIZE=head_size,
        HEAD_PADDED=triton.next_power_of_2(head_size),
        ROTARY_DIM=rotary_dim,
        IS_NEOX=is_neox,
        QK_NORM=qk_norm,
    )
    compile_sm90(
        rotary_embedding_kernel, pointers, constexprs, scalars={"eps": "fp32"}, num_warps=4
    )


@pytest.mark.parametrize("top_k, experts", [(8, 128), (6, 64)])
def test_topk_softmax_kernel(top_k: int, experts: int) -> None:
    pointers = {"logits_ptr": "*bf16", "weights_ptr": "*bf16", "ids_ptr": "*i64"}
    constexprs = dict(
        TOP_K=top_k,
        TOP_K_PADDED=triton.next_power_of_2(top_k),
        EXPERTS=experts,
        RENORMALIZE=True,
    )
    compile_sm90(topk_softmax_kernel, pointers, constexprs)


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("qtype", [2, 3, 8], ids=["Q4_0", "Q4_1", "Q8_0"])
@pytest.mark.parametrize("block_m", [16, 64])
def test_gguf_matmul_kernel(dtype: str, qtype: int, block_m: int) -> None:
    from pagedllm._triton_ops.gguf_matmul import TYPES, gguf_matmul_kernel

    type_size = {int(t): size for t, size in TYPES.items()}[qtype]
    constexprs = dict(
        QTYPE=qtype,
        TYPE_SIZE=type_size,
        HAS_BIAS=True,
        BLOCK_M=block_m,
        BLOCK_N=64,
        BLOCK_K=64,
        WIDEN=False,
    )
    pointers = {"x_ptr": f"*{dtype}", "w_ptr": "*u8", "bias_ptr": f"*{dtype}"}
    compile_sm90(gguf_matmul_kernel, pointers | {"out_ptr": f"*{dtype}"}, constexprs)
