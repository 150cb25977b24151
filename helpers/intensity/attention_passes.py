"""Attention (lesson 06): the same FLOPs, two very different byte counts."""

from __future__ import annotations

from ..dtypes import dtype_key
from ..dtypes import element_size as element_bytes
from .fusion import SOFTMAX_FLOPS_PER_ELEMENT
from .work import Work, _known, _positive


def _attention_flops(seq: int, head_dim: int) -> int:
    # S = Q K^T: seq x seq outputs, head_dim multiply-adds each -> 2 seq^2 d
    # O = P V:   seq x d outputs, seq multiply-adds each         -> 2 seq^2 d
    # softmax over S: SOFTMAX_FLOPS_PER_ELEMENT per score (the 1/sqrt(d) scale is
    # folded into Q beforehand)
    return 4 * seq * seq * head_dim + SOFTMAX_FLOPS_PER_ELEMENT * seq * seq


def attention_materialised(batch_heads: int, seq: int, head_dim: int, dtype="bf16") -> Work:
    """Attention as three kernels, the score matrix written to DRAM between them.

    Per head: ``S = Q K^T`` reads Q, K and writes S (seq x seq); the softmax reads S and
    writes P (seq x seq); ``O = P V`` reads P, V and writes O. In elements:
    ``(2 seq d + seq^2) + 2 seq^2 + (seq^2 + 2 seq d) = 4 seq d + 4 seq^2``.
    The ``seq^2`` terms dominate at long sequences, and the intensity stops growing.
    """
    _positive(batch_heads=batch_heads, seq=seq, head_dim=head_dim)
    s = element_bytes(dtype)
    key = dtype_key(dtype)
    elements = 4 * seq * head_dim + 4 * seq * seq
    return Work("attention (materialised)", f"BH={batch_heads} seq={seq} d={head_dim}", key,
                batch_heads * _attention_flops(seq, head_dim), batch_heads * elements * s, key,
                "4 seq^2 d + 5 seq^2 FLOP per head; S and P each written and read once")


def attention_tiled(batch_heads: int, seq: int, head_dim: int, dtype="bf16") -> Work:
    """Attention as one fused, tiled kernel (the FlashAttention idea).

    Scores are made tile by tile in SRAM, softmaxed online and multiplied into V at
    once: S and P never reach DRAM. Compulsory traffic per head: read Q, K, V, write O,
    ``4 seq d`` elements. (A real kernel re-reads K and V once per query tile; those
    re-reads mostly hit L2, and the napkin count leaves them out.)
    """
    _positive(batch_heads=batch_heads, seq=seq, head_dim=head_dim)
    s = element_bytes(dtype)
    key = dtype_key(dtype)
    return Work("attention (tiled)", f"BH={batch_heads} seq={seq} d={head_dim}", key,
                batch_heads * _attention_flops(seq, head_dim),
                batch_heads * 4 * seq * head_dim * s, key,
                "4 seq^2 d + 5 seq^2 FLOP per head; read Q, K, V, write O once")


ATTENTION_VERSIONS, ATTENTION_PASSES = ("naive", "flash"), ("forward", "backward")


def attention(batch: int, heads: int, seq_q: int, seq_k: int, head_dim: int, dtype="bf16",
              causal=False, version="flash", pass_="forward", kv_heads=None) -> Work:
    """One pass of multi-head attention as FlashAttention's and PyTorch's benchmarks count it,
    one count for all versions: matmul FLOPs only (softmax's ~5 per score, 1-2 % at d = 64..128,
    left out). Forward ``4 B H Nq Nk d``: S = QK^T, O = PV. Backward 2.5 times that, five
    matmuls: S again (P is not kept), dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q.
    ``causal`` halves both, the field's convention (the mask keeps N (N+1)/2 of N^2 pairs).
    Bytes: ``"flash"`` the compulsory traffic (re-reads of tiles left to L2), ``"naive"``
    every kernel's inputs and outputs (listed in the comments)."""
    _positive(batch=batch, heads=heads, seq_q=seq_q, seq_k=seq_k, head_dim=head_dim)
    _known(version, ATTENTION_VERSIONS)
    _known(pass_, ATTENTION_PASSES)
    if heads % (kvh := kv_heads or heads):
        raise ValueError(f"heads ({heads}) must be a multiple of kv_heads ({kvh})")
    s, key, fwd = element_bytes(dtype), dtype_key(dtype), pass_ == "forward"
    rows, m, kv = batch * heads * seq_q, seq_q * seq_k, batch * kvh * seq_k * head_dim * s
    n, q, e = rows * seq_k, rows * head_dim * s, kv * heads // kvh  # scores; Q; K for each head
    if version == "flash":  # read Q, K, V, write O, lse (fp32); backward: read Q, K, V, O, dO,
        # lse, write dQ, dK, dV, and write and read delta = rowsum(dO * O) (fp32)
        nbytes = 2 * q + 2 * kv + 4 * rows if fwd else 4 * q + 4 * kv + 12 * rows
    else:
        c = key != "fp32"                                   # .float(), .to(): no-ops in fp32
        # forward: QK^T, * scale, [.float()], softmax, [.to()], PV. backward: P^T dO, dO V^T,
        # [.float()], softmax backward (reads dP and P), [.to()], * scale, dS^T Q, dS K
        per_score = s * (4 + 2 * c) + 4 * (2 + 2 * c) if fwd else s * (6 + 2 * c) + 4 * (3 + 2 * c)
        # causal: masked_fill of S or dS; the forward first makes the mask (2 aranges, <=, ~)
        mask = 2 * n * s + (4 * m + 16 * (seq_q + seq_k) if fwd else m)
        nbytes = (2 if fwd else 4) * (q + e) + n * per_score + causal * mask \
            + (2 * (kv + e) if kvh != heads else 0)  # fewer K, V heads: copied, dK, dV summed
    mm = 2 if fwd else 5                             # S, O; then S again, dV, dP, dQ, dK
    return Work(f"attention {pass_} ({version})", f"B={batch} H={heads}/{kvh} Nq={seq_q} "
                f"Nk={seq_k} d={head_dim}{' causal' if causal else ''}", key,
                mm * 2 * n * head_dim // (2 if causal else 1), nbytes, key,
                f"{mm} matmuls{', halved' if causal else ''}")
