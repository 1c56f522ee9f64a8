#!/usr/bin/env python3
"""decode_vs_torch: gpt_generate's decoding against a PyTorch key/value-cache loop, same model.

Issue 25's decode comparison. Both sides load one exported GPT-2 (an --hf
directory: model.safetensors + config.json, as gpt_train's export writes it)
and decode greedily, one position a step, with a key/value cache, float32,
one thread:

- summa: `gpt_generate --hf DIR --greedy` with BATCH prompts of PROMPT bytes
  each (batched into one model of batch BATCH), --max-new-tokens NEW; its
  summary line gives the decode seconds (the steps from the last prompt
  position on: each consumes one position and picks the next token);
- PyTorch: the same GPT-2 in eager PyTorch (bench/decode_vs_torch.py's
  `Gpt2Cache`: pre-allocated key/value tensors, one position a step for the
  prompt and for the new tokens, argmax of the last logits), timed over the
  same steps.

decode tokens/s = BATCH * NEW / decode seconds on both sides. Every case runs
--rounds rounds, the two sides back to back in each; the line reports the
medians and torch/summa (> 1: summa decodes faster). For BATCH = 1 the
greedy tokens of both sides are compared (`greedy_agree`: how many of the
first NEW agree before the first difference; float32 on both sides, so a
near-tie may differ late). With --ranks N (N > 1) and --schemes, gpt_generate
also runs under `mpirun -np N` for each scheme (summa only: the scheme's
decode rate beside the one-rank figures).

    bench/decode_vs_torch.py --gpt-generate build/examples/gpt_generate \\
        --hf gpt_train_out/export --batches 1 8 --rounds 5

One JSON object per case for scripts/bench_record.py. Exit status 0; 1 when a
run fails; 77 without PyTorch.
"""

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "scripts"))
sys.path.insert(0, HERE)
from blas_threads import pin_blas_threads  # noqa: E402

pin_blas_threads(sys.argv, default=1)  # before torch loads (blas_threads.py says why)

try:
    import torch
except ImportError as e:
    print(f"decode_vs_torch: no PyTorch in {sys.executable}: {e}: skipped", file=sys.stderr)
    sys.exit(77)

from hf_check import load_safetensors  # noqa: E402  (scripts/hf_check.py: no safetensors package)

PROMPTS = [
    "ROMEO:\nBut soft, what light ",
    "JULIET:\nO Romeo, Romeo, w",
    "First Citizen:\nBefore we",
    "MENENIUS:\nWhat work's, m",
    "KING RICHARD II:\nNow is ",
    "HAMLET:\nTo be, or not to",
    "LADY MACBETH:\nOut, damne",
    "PROSPERO:\nWe are such st",
]


class Gpt2Cache:
    """GPT-2 (pre-LN, tanh GeLU, tied head) in eager PyTorch with a key/value cache."""

    def __init__(self, weights, config, batch, positions):
        def p(name):
            return weights[name if name in weights else "transformer." + name].float()

        self.n_layer, self.n_head = config["n_layer"], config["n_head"]
        self.eps = config.get("layer_norm_epsilon", 1e-5)
        self.wte, self.wpe = p("wte.weight"), p("wpe.weight")
        self.hidden = self.wte.shape[1]
        self.d = self.hidden // self.n_head
        self.layers = []
        for i in range(self.n_layer):
            pre = f"h.{i}."
            self.layers.append({k: p(pre + k) for k in (
                "ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
                "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
                "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias")})
        self.ln_f = (p("ln_f.weight"), p("ln_f.bias"))
        shape = (batch, self.n_head, positions, self.d)
        self.k = [torch.zeros(shape) for _ in range(self.n_layer)]
        self.v = [torch.zeros(shape) for _ in range(self.n_layer)]

    def step(self, ids, t):
        """Logits [batch, vocab] of position t for token ids [batch]; fills the caches at t."""
        F = torch.nn.functional
        b = ids.shape[0]
        h = self.wte[ids] + self.wpe[t]
        for i, w in enumerate(self.layers):
            x = F.layer_norm(h, (self.hidden,), w["ln_1.weight"], w["ln_1.bias"], self.eps)
            qkv = torch.addmm(w["attn.c_attn.bias"], x, w["attn.c_attn.weight"])
            q, k, v = (z.view(b, self.n_head, self.d) for z in qkv.split(self.hidden, dim=1))
            self.k[i][:, :, t] = k
            self.v[i][:, :, t] = v
            keys, values = self.k[i][:, :, : t + 1], self.v[i][:, :, : t + 1]
            scores = torch.einsum("bhd,bhtd->bht", q, keys) / (self.d ** 0.5)
            ctx = torch.einsum("bht,bhtd->bhd", torch.softmax(scores, dim=-1), values)
            h = h + torch.addmm(w["attn.c_proj.bias"], ctx.reshape(b, self.hidden),
                                w["attn.c_proj.weight"])
            x = F.layer_norm(h, (self.hidden,), w["ln_2.weight"], w["ln_2.bias"], self.eps)
            m = F.gelu(torch.addmm(w["mlp.c_fc.bias"], x, w["mlp.c_fc.weight"]),
                       approximate="tanh")
            h = h + torch.addmm(w["mlp.c_proj.bias"], m, w["mlp.c_proj.weight"])
        h = F.layer_norm(h, (self.hidden,), self.ln_f[0], self.ln_f[1], self.eps)
        return h @ self.wte.T


def torch_decode(model, prompts, new):
    """(decode seconds, greedy tokens of prompt 0): the steps gpt_generate times as decode."""
    batch, length = len(prompts), len(prompts[0])
    ids = torch.tensor(prompts, dtype=torch.long)
    out, decode_s = [], 0.0
    step = ids[:, 0]
    with torch.no_grad():
        for t in range(length + new - 1):
            t0 = time.perf_counter()
            logits = model.step(step, t)
            # bytes: gpt_generate picks among the tokenizer's 256 ids (its vocab_limit)
            nxt = torch.argmax(logits[:, :256], dim=1) if t >= length - 1 else None
            dt = time.perf_counter() - t0
            if t >= length - 1:
                decode_s += dt
                out.append(int(nxt[0]))
                step = nxt
            else:
                step = ids[:, t + 1]
    assert len(out) == new and batch == ids.shape[0]
    return decode_s, out


def summa_decode(cmd, expected_prompt_tokens):
    """(decode seconds, decode tokens, greedy tokens of prompt 0) from one gpt_generate run."""
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        sys.stderr.write(run.stdout + run.stderr)
        sys.exit(f"decode_vs_torch: {shlex.join(cmd)} exited {run.returncode}")
    m = re.search(r"decode (\d+) tokens in ([0-9.]+) s", run.stderr)
    if not m:
        sys.exit(f"decode_vs_torch: no decode summary from {shlex.join(cmd)}:\n{run.stderr}")
    pre = re.search(r"prefill (\d+) tokens", run.stderr)
    if pre is None or int(pre.group(1)) != expected_prompt_tokens:
        sys.exit(f"decode_vs_torch: gpt_generate read {pre.group(1) if pre else '?'} prompt "
                 f"tokens, expected {expected_prompt_tokens} (bytes): does the --hf directory "
                 "hold a BPE tokenizer? This comparison feeds bytes")
    first = next((json.loads(l) for l in run.stdout.splitlines() if l.startswith("{")), {})
    # The summary prints seconds with 3 decimals: time the decode from its rate
    # instead when that is printed with more digits.
    rate = re.search(r"decode \d+ tokens in [0-9.]+ s \(([0-9.]+) tokens/s\)", run.stderr)
    tokens = int(m.group(1))
    seconds = tokens / float(rate.group(1)) if rate else float(m.group(2))
    if seconds <= 0:
        sys.exit(f"decode_vs_torch: a decode time of 0 s from {shlex.join(cmd)}: decode more tokens")
    return seconds, tokens, first.get("tokens", [])


def main():
    ap = argparse.ArgumentParser(description=__doc__, allow_abbrev=False,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpt-generate", required=True, help="path of examples/gpt_generate")
    ap.add_argument("--hf", required=True, help="exported GPT-2 directory")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--prompt-bytes", type=int, default=16, help="prompt length (bytes)")
    ap.add_argument("--new", type=int, default=0,
                    help="new tokens (0: as many as fit n_positions)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--ranks", type=int, default=1, help="also run the schemes at this rank count")
    ap.add_argument("--schemes", nargs="*", default=[], help="schemes at --ranks")
    ap.add_argument("--mpirun", default="mpirun --allow-run-as-root --oversubscribe")
    args = ap.parse_args()

    with open(os.path.join(args.hf, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    if config.get("vocab_size", 0) < 256:
        sys.exit("decode_vs_torch: the prompts are bytes: the model needs vocab_size >= 256")
    weights, _ = load_safetensors(os.path.join(args.hf, "model.safetensors"))
    positions = config["n_positions"]
    length = args.prompt_bytes
    new = args.new or positions - length
    if length < 1 or new < 1 or length + new > positions:
        sys.exit(f"decode_vs_torch: prompt {length} + new {new} must fit n_positions {positions}")
    torch.set_num_threads(args.threads)

    for batch in args.batches:
        texts = [(PROMPTS[i % len(PROMPTS)] * 4)[:length] for i in range(batch)]
        prompts = [list(t.encode("utf-8"))[:length] for t in texts]
        gen = [args.gpt_generate, "--hf", args.hf, "--greedy", "--json", "--eos", "-1",
               "--max-new-tokens", str(new), "--threads", str(args.threads)]
        for t in texts:
            gen += ["--prompt", t]
        summa_s, torch_s, agree = [], [], None
        for _ in range(args.rounds):
            s, tokens, summa_tokens = summa_decode(gen, batch * length)
            if tokens != batch * new:
                sys.exit(f"decode_vs_torch: gpt_generate decoded {tokens} tokens, "
                         f"expected {batch} x {new}")
            summa_s.append(s)
            model = Gpt2Cache(weights, config, batch, positions)
            d, torch_tokens = torch_decode(model, prompts, new)
            torch_s.append(d)
            if batch == 1:
                if len(summa_tokens) != new:
                    sys.exit(f"decode_vs_torch: gpt_generate --json gave {len(summa_tokens)} "
                             f"tokens for prompt 0, expected {new}")
                agree = next((i for i, (a, b) in enumerate(zip(summa_tokens, torch_tokens))
                              if a != b), new)
        s, q = statistics.median(summa_s), statistics.median(torch_s)
        line = {"bench": "decode_vs_torch", "ranks": 1, "scheme": "serial-equivalent (1 rank)",
                "batch": batch, "prompt": length, "new": new, "threads": args.threads,
                "n_layer": config["n_layer"], "n_embd": config["n_embd"],
                "n_head": config["n_head"], "vocab": config["vocab_size"],
                "rounds": args.rounds, "torch_version": torch.__version__,
                "summa_decode_tokens_per_s": batch * new / s,
                "torch_decode_tokens_per_s": batch * new / q,
                "torch_over_summa": q / s}
        if agree is not None:
            line["greedy_agree"] = agree
        print(json.dumps(line), flush=True)
        if args.ranks > 1:
            for scheme in args.schemes:
                cmd = shlex.split(args.mpirun) + ["-np", str(args.ranks)] + gen + [
                    "--scheme", scheme]
                times = [summa_decode(cmd, batch * length)[0] for _ in range(args.rounds)]
                print(json.dumps({
                    "bench": "decode_vs_torch", "ranks": args.ranks, "scheme": scheme,
                    "batch": batch, "prompt": length, "new": new, "threads": args.threads,
                    "rounds": args.rounds,
                    "summa_decode_tokens_per_s": batch * new / statistics.median(times),
                    "torch_decode_tokens_per_s_1rank": batch * new / q}), flush=True)


if __name__ == "__main__":
    main()
