"""Context parallelism: each rank of a ``cp`` group holds one slice of the sequence, attention still sees all of it.

``accelerator.maybe_context_parallel(buffers=[ids, labels, positions], buffer_seq_dims=[1, 1, 1])`` opens a block
in which

1. each buffer is cut in place along its sequence dimension into ``cp`` contiguous slices, this rank keeping its
   own (restored when the block ends, except the ``no_restore_buffers``), so the model computes on ``S / cp``
   positions. A tensor given twice (``labels`` the very tensor of ``input_ids``, as Transformers' batches often
   have it) is cut once, not twice;
2. every ``torch.nn.functional.scaled_dot_product_attention`` call is taken over: on CUDA by torch's own
   ``context_parallel`` (ring attention over the ``cp`` mesh, ``cp_comm_strategy`` choosing how keys and values
   rotate); elsewhere (CPUs, where torch has no sharding rule for its fused attention kernels) the local query,
   key and value become DTensors sharded on the sequence over the ``cp`` mesh, and attention runs with the math
   kernel: DTensor gathers the keys and values the local queries need (forward) and sends their gradients back
   (backward), and a causal mask is laid over the whole sequence.

Everything outside the block, and every other operation inside it, is unchanged: layers that work token by token
(embeddings, MLPs, norms) just see fewer tokens. Positions must come in as a buffer (``position_ids``), as a model
can not know where its slice starts. Attention masks are not supported (use ``is_causal=True``); neither is
attention dropout. The loss of each rank is the mean over its slice; FSDP2 averages gradients over
``dp_shard x cp``, which makes them the gradients of the whole sequence's mean.
"""
from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Iterator, Optional, Sequence

import torch

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

__all__ = ["context_parallel_block", "shard_buffers"]


def _check_buffers(buffers, seq_dims, no_restore, cp_size: int) -> None:
    if len(buffers) != len(seq_dims):
        raise ValueError(f"maybe_context_parallel got {len(buffers)} buffers and {len(seq_dims)} buffer_seq_dims: "
                         "give one sequence dimension per buffer.")
    for buffer in no_restore:
        if not any(buffer is given for given in buffers):
            raise ValueError("no_restore_buffers must be a subset of buffers (the same tensor objects).")
    for index, (buffer, dim) in enumerate(zip(buffers, seq_dims)):
        if not isinstance(buffer, torch.Tensor) or isinstance(buffer, torch.nn.Parameter):
            raise TypeError(f"maybe_context_parallel: buffer {index} must be a tensor (not a parameter), got "
                            f"{type(buffer).__name__}.")
        if buffer._base is not None or not buffer.is_contiguous() or buffer.requires_grad:
            raise ValueError(f"maybe_context_parallel: buffer {index} is "
                             f"{'a tensor that requires grad' if buffer.requires_grad else 'a view of another tensor'}"
                             " (e.g. tokens[:, :-1]); it is sliced in place, which would overwrite what it views: "
                             "pass a tensor of its own (.clone(), or .detach().clone()).")
        if not -buffer.dim() <= dim < buffer.dim():
            raise ValueError(f"maybe_context_parallel: buffer {index} has {buffer.dim()} dimensions; its sequence "
                             f"dimension {dim} does not exist.")
        if buffer.shape[dim] % cp_size:
            raise ValueError(f"maybe_context_parallel: buffer {index} has {buffer.shape[dim]} positions along "
                             f"dimension {dim}, which cp_size={cp_size} does not divide: pad the sequences to a "
                             f"multiple of {cp_size}.")


def _each_once(buffers: list, seq_dims: list) -> tuple[list, list]:
    """The buffers without repeats of one tensor (cutting it twice would keep a quarter of it); the same tensor
    given with two sequence dimensions is an error."""
    kept: list = []
    dims: list = []
    for index, (buffer, dim) in enumerate(zip(buffers, seq_dims)):
        earlier = next((i for i, other in enumerate(kept) if other is buffer), None)
        if earlier is None:
            kept.append(buffer)
            dims.append(dim)
        elif dims[earlier] % buffer.dim() != dim % buffer.dim():
            raise ValueError(f"maybe_context_parallel: buffer {index} is an earlier buffer again (the same tensor) "
                             f"with another sequence dimension ({dim}, before {dims[earlier]}).")
    return kept, dims


@torch.no_grad()
def shard_buffers(buffers: Sequence[torch.Tensor], seq_dims: Sequence[int], cp_size: int, cp_rank: int,
                  no_restore: Sequence[torch.Tensor] = ()) -> list[tuple[torch.Tensor, Optional[torch.Tensor]]]:
    """Keep this rank's contiguous slice of each buffer, in place; returns ``[(buffer, original or None)]`` for
    ``restore_buffers``."""
    saved = []
    for buffer, dim in zip(buffers, seq_dims):
        keep = any(buffer is other for other in no_restore)
        original = None if keep else buffer.clone()
        piece = buffer.chunk(cp_size, dim=dim)[cp_rank].clone()
        buffer.resize_(piece.shape)
        buffer.copy_(piece)
        saved.append((buffer, original))
    return saved


@torch.no_grad()
def restore_buffers(saved: list) -> None:
    for buffer, original in saved:
        if original is not None:
            buffer.resize_(original.shape)
            buffer.copy_(original)


class _SequenceShardedAttention(torch.overrides.TorchFunctionMode):
    """Runs ``scaled_dot_product_attention`` on sequence slices as DTensors over the ``cp`` mesh (math kernel)."""

    def __init__(self, mesh):
        super().__init__()
        self.mesh = mesh

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not torch.nn.functional.scaled_dot_product_attention:
            return func(*args, **kwargs)
        return self._attention(*args, **kwargs)

    def _attention(self, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                   enable_gqa=False):
        from torch.distributed.tensor import DTensor, Shard
        from torch.distributed.tensor.experimental import implicit_replication
        from torch.nn.attention import SDPBackend, sdpa_kernel

        if attn_mask is not None:
            raise ValueError("Context parallelism computes full or causal attention over the whole sequence and "
                             "cannot apply an attention mask made for one slice: call attention with "
                             "is_causal=True and no attn_mask (drop the attention_mask from the model's inputs).")
        if dropout_p:
            raise ValueError(f"Context parallelism does not support attention dropout (dropout_p={dropout_p}): set the "
                             "model's attention dropout to 0.")
        pieces = [DTensor.from_local(t, self.mesh, [Shard(2)], run_check=False) for t in (query, key, value)]
        with sdpa_kernel([SDPBackend.MATH]), implicit_replication():
            output = torch.nn.functional.scaled_dot_product_attention(*pieces, is_causal=is_causal, scale=scale,
                                                                       enable_gqa=enable_gqa)
        if tuple(output.placements) != (Shard(2),):  # DTensor may pick another split (by heads, when cp divides
            output = output.redistribute(self.mesh, [Shard(2)])  # them): this rank's slice of the sequence back
        return output.to_local()


@contextlib.contextmanager
def context_parallel_block(mesh: DeviceMesh, buffers: Optional[Sequence[torch.Tensor]],
                           buffer_seq_dims: Optional[Sequence[int]], no_restore_buffers: Optional[set] = None,
                           comm_strategy: str = "allgather") -> Iterator[None]:
    """The block of a context-parallel step over the 1-D ``cp`` ``mesh`` (see the module doc)."""
    buffers, seq_dims = list(buffers or []), list(buffer_seq_dims or [])
    no_restore = list(no_restore_buffers or [])
    _check_buffers(buffers, seq_dims, no_restore, mesh.size())
    buffers, seq_dims = _each_once(buffers, seq_dims)
    if mesh.device_type == "cuda":
        from torch.distributed.tensor.experimental import context_parallel
        from torch.distributed.tensor.experimental._attention import set_rotate_method

        set_rotate_method(comm_strategy)
        with context_parallel(mesh, buffers=buffers, buffer_seq_dims=seq_dims, no_restore_buffers=set(no_restore)):
            yield
        return
    saved = shard_buffers(buffers, seq_dims, mesh.size(), mesh.get_local_rank(), no_restore)
    try:
        with _SequenceShardedAttention(mesh):
            yield
    finally:
        restore_buffers(saved)
