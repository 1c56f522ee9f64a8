#!/usr/bin/env python3
"""torch_block: one GPT-2 block in plain PyTorch eager, timed like gpt_layer's block.

The PyTorch side of the issue-6 comparison (bench/README.md, "GPU"): the same
pre-LayerNorm GPT-2 block that summa's TransformerBlock2D computes,

    x + c_proj(attn(ln_1(x)))  ->  h;   h + mlp_c_proj(gelu_tanh(c_fc(ln_2(h))))

with attention = causal softmax(q k^T / sqrt(d)) v over `heads` heads, all
linears with biases (GPT-2's Conv1D), GeLU in its tanh form, on random
activations of shape [batch, seq, hidden], timed forward and forward +
backward (dL/dx and every parameter gradient from a random dL/dy), with the
device synchronised around every timed step, median over --reps steps after
--warmup untimed ones. One JSON object per line, with the keys of
gpt_layer's block lines, so bench/gpu_ratio.py can pair them.

Attention defaults to the explicit form (scores matrix, masked_fill, softmax,
matmul) because that is what summa's block does (it materialises the s x s
scores and runs a causal softmax kernel on them): the comparison is then
between two implementations of the same algorithm. --sdpa uses
torch.nn.functional.scaled_dot_product_attention(is_causal=True) instead
(flash / memory-efficient kernels, PyTorch >= 2.0), the faster baseline a
PyTorch user would reach for; its lines carry "sdpa": true. No torch.compile.

    python3 bench/torch_block.py --device cuda --hidden 1024 --heads 16 --seq 1024 --batch 8
    python3 bench/torch_block.py --device cpu --hidden 64 --heads 4 --seq 32 --batch 2
"""

import argparse
import json
import math
import statistics
import sys
import time

from blas_threads import pin_blas_threads  # noqa: E402  (bench/blas_threads.py)

if "cuda" not in " ".join(sys.argv):
    pin_blas_threads(sys.argv)

try:
    import torch
    import torch.nn.functional as F
except ImportError as e:  # CTest's SKIP_RETURN_CODE (bench/CMakeLists.txt)
    print(f"torch_block: no PyTorch in {sys.executable}: {e}: skipped", file=sys.stderr)
    sys.exit(77)

DTYPES = {"f32": torch.float32, "f64": torch.float64, "bf16": torch.bfloat16}


class Block(torch.nn.Module):
    """GPT-2 block (pre-LN), parameters named as in Hugging Face's GPT2Block."""

    def __init__(self, hidden, heads, eps, sdpa):
        super().__init__()
        self.heads = heads
        self.sdpa = sdpa
        self.ln_1 = torch.nn.LayerNorm(hidden, eps=eps)
        self.c_attn = torch.nn.Linear(hidden, 3 * hidden)
        self.attn_c_proj = torch.nn.Linear(hidden, hidden)
        self.ln_2 = torch.nn.LayerNorm(hidden, eps=eps)
        self.c_fc = torch.nn.Linear(hidden, 4 * hidden)
        self.mlp_c_proj = torch.nn.Linear(4 * hidden, hidden)

    def attention(self, x):
        b, s, h = x.shape
        d = h // self.heads
        q, k, v = self.c_attn(x).split(h, dim=2)
        # [b, heads, s, d]
        q = q.view(b, s, self.heads, d).transpose(1, 2)
        k = k.view(b, s, self.heads, d).transpose(1, 2)
        v = v.view(b, s, self.heads, d).transpose(1, 2)
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(d))
            mask = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
            scores = scores.masked_fill(mask, float("-inf"))
            y = torch.matmul(torch.softmax(scores, dim=-1), v)
        y = y.transpose(1, 2).reshape(b, s, h)
        return self.attn_c_proj(y)

    def forward(self, x):
        h = x + self.attention(self.ln_1(x))
        return h + self.mlp_c_proj(F.gelu(self.c_fc(self.ln_2(h)), approximate="tanh"))


def init_gpt2(block, std=0.02):
    """GPT-2 initialisation: weights N(0, 0.02), biases 0, LayerNorm (1, 0)."""
    with torch.no_grad():
        for name, p in block.named_parameters():
            if name.startswith("ln_"):
                p.fill_(1.0 if name.endswith("weight") else 0.0)
            elif name.endswith("bias"):
                p.zero_()
            else:
                p.normal_(0.0, std)


def block_flops(b, s, h, backward):
    """Narayanan et al. 2021 per layer, as gpt_layer: 24Bsh^2(1+s/6h), x3 with backward."""
    base = b * s * h * h * (1 + s / (6 * h))
    return (72 * base, "72Bsh^2(1+s/6h)") if backward else (24 * base, "24Bsh^2(1+s/6h)")


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_case(args, device, dtype_name):
    dtype = DTYPES[dtype_name]
    gen = torch.Generator(device="cpu").manual_seed(args.seed)
    block = Block(args.hidden, args.heads, args.eps, args.sdpa)
    init_gpt2(block)
    block = block.to(device=device, dtype=dtype)
    x = (torch.rand(args.batch, args.seq, args.hidden, generator=gen) * 2 - 1).to(device, dtype)
    dy = ((torch.rand(args.batch, args.seq, args.hidden, generator=gen) * 2 - 1) * 1e-3).to(
        device, dtype
    )
    x.requires_grad_(True)
    lines = []
    for backward in (False, True):

        def step():
            y = block(x)  # autograd on: the forward keeps what backward needs, as summa's does
            if backward:
                # Gradients accumulate into the existing .grad tensors (allocated
                # by the warm-up), like a training step between two zero_grad().
                y.backward(dy)
            return y

        finite = True
        for _ in range(args.warmup):
            step()
        times = []
        for _ in range(args.reps):
            synchronize(device)
            t0 = time.perf_counter()
            y = step()
            synchronize(device)
            times.append(time.perf_counter() - t0)
        with torch.no_grad():
            finite = bool(torch.isfinite(y).all())
            if backward:
                finite = finite and bool(torch.isfinite(x.grad).all())
        t = statistics.median(times)
        flops, formula = block_flops(args.batch, args.seq, args.hidden, backward)
        line = {
            "bench": "torch_block",
            "what": "block",
            "pass": "fwd_bwd" if backward else "fwd",
            "q": 1,
            "ranks": 1,
            "dtype": dtype_name,
            "hidden": args.hidden,
            "heads": args.heads,
            "seq": args.seq,
            "batch": args.batch,
            "reps": args.reps,
            "warmup": args.warmup,
            "backend": "torch",
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "tf32": bool(args.tf32),
            "sdpa": bool(args.sdpa),
            "torch_version": torch.__version__,
            "median_s": t,
            "min_s": min(times),
            "tokens_per_s": args.batch * args.seq / t,
            "flops_formula": formula,
            "model_flops": flops,
            "model_flops_per_s": flops / t,
            "finite": finite,
        }
        lines.append(line)
        print(json.dumps(line), flush=True)
    return all(line["finite"] for line in lines)


def main():
    p = argparse.ArgumentParser(description=__doc__, allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    p.add_argument("--hidden", type=int, default=192)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--batch", type=int, default=6, help="sequences per step")
    p.add_argument("--dtype", default="f32", help="list of f32, f64, bf16 (comma-separated)")
    p.add_argument("--reps", type=int, default=5, help="timed steps (median reported)")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    p.add_argument("--eps", type=float, default=1e-5, help="LayerNorm epsilon (GPT-2: 1e-5)")
    p.add_argument("--tf32", action="store_true", help="cuda: TF32 tensor cores in f32 matmuls")
    p.add_argument("--sdpa", action="store_true",
                   help="fused scaled_dot_product_attention instead of the explicit softmax")
    p.add_argument("--threads", type=int, default=0, help="cpu: torch threads (0: torch's default)")
    p.add_argument("--seed", type=int, default=1234)
    args = p.parse_args()

    dtypes = [d for d in args.dtype.split(",") if d]
    for d in dtypes:
        if d not in DTYPES:
            p.error(f"--dtype {d}: not one of {', '.join(DTYPES)}")
    if args.hidden % args.heads:
        p.error(f"--hidden={args.hidden} must be divisible by --heads={args.heads}")
    for name in ("hidden", "heads", "seq", "batch", "reps"):
        if getattr(args, name) < 1:
            p.error(f"--{name}={getattr(args, name)} must be positive")
    if args.warmup < 0:
        p.error(f"--warmup={args.warmup} must be >= 0")
    if args.sdpa and not hasattr(F, "scaled_dot_product_attention"):
        p.error(f"--sdpa needs PyTorch >= 2.0 (this is {torch.__version__})")
    device = torch.device(args.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            print(f"torch_block: torch {torch.__version__} sees no CUDA device", file=sys.stderr)
            return 3
        torch.backends.cuda.matmul.allow_tf32 = bool(args.tf32)
        torch.backends.cudnn.allow_tf32 = bool(args.tf32)
    elif args.threads > 0:
        torch.set_num_threads(args.threads)
    print(
        f"torch_block: torch {torch.__version__} on {device}, hidden {args.hidden}, heads "
        f"{args.heads}, seq {args.seq}, batch {args.batch}, attention "
        f"{'sdpa' if args.sdpa else 'explicit'}, tf32 {bool(args.tf32)}",
        file=sys.stderr,
    )
    ok = True
    for d in dtypes:
        ok = run_case(args, device, d) and ok
    if not ok:
        print("torch_block: FAILED: an output or gradient was not finite", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
