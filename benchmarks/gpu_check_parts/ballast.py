"""The ballast: make a real card have only the budget free, so the plain loop meets the budget as physics.

    python benchmarks/gpu_check_parts/ballast.py --leave 8589934592 [--device 0]

isoprobe emulates a budget B with an allocator fraction (``set_per_process_memory_fraction``), the memory the process
holds outside the allocator taken off first. That recipe is what is under test, so the yardstick must not use it
(issue 57): this process takes ``free - B`` of the card with plain allocations and holds them; a plain loop started
afterwards in a fresh process, with no fraction set, then finds exactly B free on the card: its context, its
libraries' handles and kernels, its allocator's cache and fragmentation all come out of that B, as they would on a
card that small. Nothing of isoprobe is imported, and nothing of the plain loop: the two share only the card.

Its allocations go through torch's caching allocator (one ``torch.empty`` per chunk): a request above 10 MiB gets a
segment of its own rounded up to 2 MiB (c10's ``get_allocation_size``), which is one ``cudaMalloc`` of that size, so
the card's free memory falls by that much. The chunks are rounded *down* to that granule (``ballast_chunks``), then
the free memory is read again and topped up, so what is left ends within one granule above B, never below it.

Protocol, for benchmarks/gpu_check.py: one JSON line on stdout when the ballast is held (``{"ready": true,
"free_bytes": ..., "held_bytes": ...}``) or could not be (``{"ready": false, "error": ...}``, exit 3: the card has
less than B free, or an allocation failed); then it holds until its stdin closes or it is signalled (SIGTERM), and
exits 0. Its context and allocations go with the process.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys

MiB = 1024**2
GiB = 1024**3
#: c10's kRoundLarge: a large request's segment is a multiple of this.
GRANULE = 2 * MiB
#: One allocation at most this large (fewer calls; any size works).
CHUNK = 16 * GiB
#: Top-up rounds after the first pass (the driver may take a page table's worth for large mappings).
TOP_UPS = 4


def ballast_chunks(free_bytes: int, leave_bytes: int, granule: int = GRANULE, chunk: int = CHUNK) -> list[int]:
    """Pure: the allocation sizes that take ``free_bytes - leave_bytes`` of a card, rounded down to ``granule``, in
    chunks of at most ``chunk``. Empty when there is less than one granule to take (or nothing: below the budget)."""
    if free_bytes < 0 or leave_bytes < 0 or granule <= 0 or chunk < granule:
        raise ValueError("free, leave must be non-negative, and chunk at least one granule")
    take = max(0, free_bytes - leave_bytes) // granule * granule
    sizes = []
    while take > 0:
        size = min(chunk // granule * granule, take)
        sizes.append(size)
        take -= size
    return sizes


def hold(torch, device: int, leave_bytes: int) -> dict:
    """Take the card down to ``leave_bytes`` free (within one granule above it); return the ready line."""
    torch.cuda.init()
    torch.cuda.set_device(device)
    held = []
    free, total = torch.cuda.mem_get_info(device)
    if free < leave_bytes:
        return {"ready": False, "error": f"the card has {free} bytes free, less than the {leave_bytes} to leave",
                "free_bytes": free, "total_bytes": total}
    for _ in range(1 + TOP_UPS):
        sizes = ballast_chunks(free, leave_bytes)
        if not sizes:
            break
        for size in sizes:
            held.append(torch.empty(size, dtype=torch.uint8, device=f"cuda:{device}"))
        torch.cuda.synchronize(device)
        free, total = torch.cuda.mem_get_info(device)
    hold.tensors = held  # kept alive until the process ends
    return {"ready": free >= leave_bytes, "free_bytes": free, "total_bytes": total, "leave_bytes": leave_bytes,
            "held_bytes": sum(t.numel() for t in held), "chunks": len(held),
            **({} if free >= leave_bytes else {"error": "the card's free memory fell below the budget while "
                                                        "taking it (another process?)"})}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Hold all but --leave bytes of a GPU's free memory until stdin "
                                                 "closes or SIGTERM.")
    parser.add_argument("--leave", type=int, required=True, help="bytes to leave free on the card")
    parser.add_argument("--device", type=int, default=0)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        import torch

        line = hold(torch, args.device, args.leave)
    except Exception as exc:  # no ballast: said, never a half-held card passed off as ready
        line = {"ready": False, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    print(json.dumps(line), flush=True)
    if not line["ready"]:
        return 3
    sys.stdin.read()  # held until the check closes our stdin (or signals us)
    return 0


if __name__ == "__main__":
    sys.exit(main())
