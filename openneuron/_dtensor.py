"""DTensor sharding rules for the ops neuron dispatches to that DTensor does not know.

The native kernels' ops (openneuron::rms_norm_* and cross_entropy_*) reach DTensor when a
TorchDispatchMode is active (selective activation checkpointing, as torchtitan applies it, and
tracing): DTensors without a mode take the ATen composite (csrc/aten/ops/native_kernels.h). Their
rules: rms_norm sharded over any dimension it does not normalize (the weight's gradient then a
partial sum), cross-entropy replicated or, unreduced, sharded over rows.

`F.scaled_dot_product_attention` on neuron runs `_scaled_dot_product_fused_attention_overrideable`
(the PrivateUse1 SDPA op, csrc/aten/ops/native_attention.cpp); DTensor has rules for CUDA's
flash / efficient / cuDNN ops only, so attention on DTensors (tensor parallelism with
`use_local_output=False`, as torchtitan and the PyTorch TP examples do) would fail with "does not
have a sharding strategy registered". The rules below are CUDA flash attention's: replicated,
sharded over heads (dim 1) or over the batch (dim 0). Registered once, when the first "neuron"
process group is created (openneuron/distributed.py).
"""
from __future__ import annotations

import torch

_registered = False


def register() -> None:
    global _registered
    if _registered:
        return
    _registered = True
    from torch.distributed.tensor._op_schema import OpStrategy, RuntimeSchemaInfo
    from torch.distributed.tensor._ops.utils import (
        expand_to_full_mesh_op_strategy,
        register_op_strategy,
    )
    from torch.distributed.tensor.placement_types import Partial, Replicate, Shard

    aten = torch.ops.aten

    def bias_placement(bias, q, dim):
        # a mask broadcast over `dim` (size 1 there, or fewer dims) stays whole on every rank
        if bias.ndim == 4 and bias.shape[dim] == q.shape[dim]:
            return Shard(dim)
        return Replicate()

    @register_op_strategy(aten._scaled_dot_product_fused_attention_overrideable.default,
                          schema_info=RuntimeSchemaInfo(4))
    def sdpa_forward(op_schema):
        mesh = op_schema.get_mesh_from_args()
        args = op_schema.args_schema
        q = args[0]
        bias = args[3] if len(args) > 3 and isinstance(args[3], OpStrategy) else None
        strategies = []
        for p in (Replicate(), Shard(1), Shard(0)):
            # out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, philox_seed, philox_offset,
            # debug_attn_mask; then q, k, v[, attn_bias]
            dim = p.dim if isinstance(p, Shard) else None
            row = [p, p, None, None, None, None, Replicate(), Replicate(), None, p, p, p]
            if bias is not None:
                row.append(Replicate() if dim is None else bias_placement(bias, q, dim))
            strategies.append(row)
        return expand_to_full_mesh_op_strategy(mesh, op_schema, strategies, input_index=9)

    @register_op_strategy(aten._scaled_dot_product_fused_attention_overrideable_backward.default)
    def sdpa_backward(op_schema):
        mesh = op_schema.get_mesh_from_args(validate=False)
        args = op_schema.args_schema
        q = args[1]
        # tensor arguments by position: grad_out, q, k, v, attn_bias, out, logsumexp follow the
        # sharding; cum_seq_q/k and the philox seed/offset are replicated
        sharded = {0, 1, 2, 3, 6, 7}
        strategies = []
        for p in (Replicate(), Shard(1), Shard(0)):
            dim = p.dim if isinstance(p, Shard) else None
            row = [p, p, p, None]  # grad_q, grad_k, grad_v, grad_attn_bias
            for i, a in enumerate(args):
                if not isinstance(a, OpStrategy):
                    continue
                if i == 4:
                    row.append(Replicate() if dim is None else bias_placement(a, q, dim))
                else:
                    row.append(p if i in sharded else Replicate())
            strategies.append(row)
        return expand_to_full_mesh_op_strategy(mesh, op_schema, strategies, input_index=4)

    neuron = torch.ops.openneuron

    @register_op_strategy(neuron.rms_norm_forward.default, schema_info=RuntimeSchemaInfo(1))
    def rms_forward(op_schema):
        mesh = op_schema.get_mesh_from_args()
        x, k, weight = op_schema.args_schema[:3]
        rows = x.strategies[0].output_spec.ndim - k
        strategies = []
        for p in (Replicate(), *(Shard(d) for d in range(rows))):
            row = [p, p, p]  # out, rstd; input
            if isinstance(weight, OpStrategy):
                row.append(Replicate())
            strategies.append(row)
        return expand_to_full_mesh_op_strategy(mesh, op_schema, strategies, input_index=2)

    @register_op_strategy(neuron.rms_norm_backward.default, schema_info=RuntimeSchemaInfo(4))
    def rms_backward(op_schema):
        mesh = op_schema.get_mesh_from_args(validate=False)
        _, x, _, weight, k = op_schema.args_schema[:5]
        mask = op_schema.args_schema[5]
        has_weight = isinstance(weight, OpStrategy)
        rows = x.strategies[0].output_spec.ndim - k
        strategies = []
        for p in (Replicate(), *(Shard(d) for d in range(rows))):
            dw = (Replicate() if isinstance(p, Replicate) else Partial()) \
                if has_weight and mask[1] else None
            row = [p if mask[0] else None, dw, p, p, p]  # grad_input, grad_weight; grad, x, rstd
            if has_weight:
                row.append(Replicate())
            strategies.append(row)
        return expand_to_full_mesh_op_strategy(mesh, op_schema, strategies, input_index=2)

    @register_op_strategy(neuron.cross_entropy_forward.default, schema_info=RuntimeSchemaInfo(2))
    def ce_forward(op_schema):
        mesh = op_schema.get_mesh_from_args()
        reduction = op_schema.args_schema[2]
        strategies = [[Replicate()] * 4]  # out, lse; logits, target
        if reduction == 0:
            strategies.append([Shard(0)] * 4)
        return expand_to_full_mesh_op_strategy(mesh, op_schema, strategies, input_index=2)

    @register_op_strategy(neuron.cross_entropy_backward.default,
                          schema_info=RuntimeSchemaInfo(4))
    def ce_backward(op_schema):
        mesh = op_schema.get_mesh_from_args(validate=False)
        reduction = op_schema.args_schema[4]
        strategies = [[Replicate()] * 5]  # grad_logits; grad, logits, target, lse
        if reduction == 0:
            strategies.append([Shard(0)] * 5)
        return expand_to_full_mesh_op_strategy(mesh, op_schema, strategies, input_index=1)
