"""A model, no GPU needed: how many bytes of A and B would the persistent and the stream-K
kernels read from DRAM through an LRU L2, on the drawn record's slowest tail shapes?

Each program takes one K step per unit of time, all in lockstep, in the kernel's own order
(the persistent kernel's tiles dealt round-robin; stream-K's pieces walked from the last
step back, as :func:`helpers.kernels.matmul.streamk.matmul_kernel_streamk` walks them), and
each step touches one ``BLOCK_M x 64`` box of A and one ``64 x BLOCK_N`` box of B. A box not
in the modelled L2 (least recently used first out) is read from DRAM. Real L2 is split in
two halves and hashed, and programs drift apart, so this bounds re-reads from below; it
answers one question for ``streamk_l2_probe.py``: does stream-K's order alone make the
kernels read A and B from DRAM more than once?

    python3 tests/gpu/streamk_l2_model.py [L2 MiB, default 50]
"""
import sys
from collections import OrderedDict

from helpers.kernels.matmul.ladder import grouped_tile
from helpers.kernels.matmul.streamk import stream_k_tiles

tile_of = getattr(grouped_tile, "fn", grouped_tile)      # the Python body of the jit function
SHAPES = [(448, 4632, 5760), (4432, 904, 4352), (3048, 688, 6144), (1624, 2600, 2304),
          (672, 2984, 6400), (488, 4432, 4864)]


def program_steps(M, N, K, bm, bn, bk, sms, streamk, group_m=8):
    """Each program's (pid_m, pid_n, k) steps in the order it takes them."""
    npm, npn, steps = -(-M // bm), -(-N // bn), -(-K // bk)
    tiles = npm * npn
    shared = stream_k_tiles(tiles, sms) if streamk else 0
    whole = tiles - shared
    out = []
    for pid in range(sms if streamk else min(sms, tiles)):
        seq = []
        for t in range(pid, whole, sms):
            m, n = tile_of(t, npm, npn, group_m)
            seq += [(m, n, k) for k in range(steps)]
        total = shared * steps
        first, end = pid * total // sms, (pid + 1) * total // sms
        while end > first:                       # stream-K's pieces, last one first
            t = (end - 1) // steps
            k_first = max(first - t * steps, 0)
            m, n = tile_of(whole + t, npm, npn, group_m)
            seq += [(m, n, k) for k in range(k_first, end - t * steps)]
            end = t * steps + k_first
        out.append(seq)
    return out


def dram_bytes(seqs, a_box, b_box, l2_bytes):
    cache, held, read = OrderedDict(), 0, 0
    for t in range(max(len(s) for s in seqs)):
        for s in seqs:
            if t < len(s):
                m, n, k = s[t]
                for key, size in ((("A", m, k), a_box), (("B", n, k), b_box)):
                    if key in cache:
                        cache.move_to_end(key)
                        continue
                    read, held, cache[key] = read + size, held + size, size
                    while held > l2_bytes:
                        held -= cache.popitem(last=False)[1]
    return read


if __name__ == "__main__":
    l2 = float(sys.argv[1] if len(sys.argv) > 1 else 50) * 2**20
    for M, N, K in SHAPES:
        once = 2 * (M * K + K * N) / 2**20
        for bm, bn in ((128, 256), (128, 128)):
            for streamk in (False, True):
                seqs = program_steps(M, N, K, bm, bn, 64, 132, streamk)
                mib = dram_bytes(seqs, bm * 64 * 2, 64 * bn * 2, l2) / 2**20
                print(f"{M}x{N}x{K} bf16 {bm}x{bn} {'stream-K  ' if streamk else 'persistent'}"
                      f" steps {max(map(len, seqs)):4d}  DRAM {mib:6.1f} MiB"
                      f"  (A and B once: {once:.1f})")
