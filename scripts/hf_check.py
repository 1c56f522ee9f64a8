#!/usr/bin/env python3
"""Independent check of a GPT-2 exported by summa::io::export_hf_gpt2.

Reads DIR/model.safetensors by hand (JSON header + numpy.frombuffer; no
safetensors package), rebuilds GPT-2 in plain PyTorch from the Hugging Face
names (pre-LN blocks, tanh GeLU, causal softmax attention, head tied to wte,
mean cross-entropy), all in float64, and prints the loss on a batch:

    hf_check.py DIR BATCH_FILE BATCH SEQ [--logits OUT]

BATCH_FILE holds BATCH*SEQ little-endian int32 token ids, then BATCH*SEQ
int32 targets (targets[b, t] is the token to predict at position t: already
shifted, every position counts, as summa's GptModel::forward takes them).

Prints `loss=<value>` (17 significant digits) and exits 0. With `--logits
OUT` it also writes the logits of every position to OUT: BATCH*SEQ*vocab
little-endian float64, row-major [batch, seq, vocab] (what summa's
Gpt::forward_logits computes, for the inference check). When the
`transformers` package imports, it also loads DIR with
GPT2LMHeadModel.from_pretrained (float64) and prints
`loss_transformers=<value>` for the same batch. Exits 2 with a message on bad
input. Needs torch and numpy only (Debian: python3-torch, python3-numpy).
"""

import json
import math
import os
import struct
import sys

import numpy as np
import torch

NUMPY_DTYPES = {"F32": "<f4", "F64": "<f8", "F16": "<f2"}


def fail(message):
    print(f"hf_check.py: {message}", file=sys.stderr)
    sys.exit(2)


def load_safetensors(path):
    """(name -> float64 torch tensor, set of the file's dtypes), parsed from the raw bytes."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        fail(f"{path}: shorter than 8 bytes")
    (n,) = struct.unpack("<Q", raw[:8])
    if 8 + n > len(raw):
        fail(f"{path}: header length {n} larger than the file")
    header = json.loads(raw[8 : 8 + n].decode("utf-8"))
    base = 8 + n
    tensors, dtypes = {}, set()
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        buf = raw[base + begin : base + end]
        dtype = info["dtype"]
        dtypes.add(dtype)
        if dtype == "BF16":
            # bfloat16 = the upper 16 bits of a float32
            bits = np.frombuffer(buf, dtype="<u2").astype(np.uint32) << 16
            values = bits.view(np.float32)
        elif dtype in NUMPY_DTYPES:
            values = np.frombuffer(buf, dtype=NUMPY_DTYPES[dtype])
        else:
            fail(f"{path}: tensor {name} has dtype {dtype}, not a float type")
        shape = info["shape"]
        if values.size != math.prod(shape):
            fail(f"{path}: tensor {name}: {values.size} values for shape {shape}")
        tensors[name] = torch.from_numpy(values.astype(np.float64).reshape(shape))
    return tensors, dtypes


def gelu_tanh(x):
    # Hugging Face's gelu_new (and summa's GeLU).
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def layer_norm(x, weight, bias, eps):
    mean = x.mean(dim=-1, keepdim=True)
    var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * weight + bias


def gpt2_loss(w, config, tokens, targets):
    def p(name):
        if name in w:
            return w[name]
        if "transformer." + name in w:
            return w["transformer." + name]
        fail(f"model.safetensors has no tensor {name}")

    n_layer, n_head = config["n_layer"], config["n_head"]
    eps = config.get("layer_norm_epsilon", 1e-5)
    batch, seq = tokens.shape
    wte = p("wte.weight")
    vocab, n_embd = wte.shape
    d = n_embd // n_head
    h = wte[tokens] + p("wpe.weight")[torch.arange(seq)]
    causal = torch.tril(torch.ones(seq, seq, dtype=torch.bool))
    for i in range(n_layer):
        pre = f"h.{i}."
        x = layer_norm(h, p(pre + "ln_1.weight"), p(pre + "ln_1.bias"), eps)
        qkv = x @ p(pre + "attn.c_attn.weight") + p(pre + "attn.c_attn.bias")  # Conv1D [in, out]
        q, k, v = qkv.split(n_embd, dim=2)
        q, k, v = (t.reshape(batch, seq, n_head, d).transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(d)
        scores = scores.masked_fill(~causal, float("-inf"))
        context = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(batch, seq, n_embd)
        h = h + context @ p(pre + "attn.c_proj.weight") + p(pre + "attn.c_proj.bias")
        x = layer_norm(h, p(pre + "ln_2.weight"), p(pre + "ln_2.bias"), eps)
        m = gelu_tanh(x @ p(pre + "mlp.c_fc.weight") + p(pre + "mlp.c_fc.bias"))
        h = h + m @ p(pre + "mlp.c_proj.weight") + p(pre + "mlp.c_proj.bias")
    h = layer_norm(h, p("ln_f.weight"), p("ln_f.bias"), eps)
    logits = h @ wte.T  # tied head
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))
    return loss, logits


def transformers_loss(directory, tokens, targets):
    """The loss from transformers' GPT2LMHeadModel, or None when it is not installed."""
    try:
        from transformers import GPT2LMHeadModel  # noqa: PLC0415
    except Exception:  # noqa: BLE001 - any import failure means "not available"
        return None
    model = GPT2LMHeadModel.from_pretrained(directory, torch_dtype=torch.float64)
    model.eval()
    with torch.no_grad():
        logits = model(tokens).logits
    return torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)
    ).item()


def main(argv):
    logits_out = None
    if len(argv) == 7 and argv[5] == "--logits":
        logits_out = argv[6]
    elif len(argv) != 5:
        fail("usage: hf_check.py DIR BATCH_FILE BATCH SEQ [--logits OUT]")
    directory, batch_file = argv[1], argv[2]
    batch, seq = int(argv[3]), int(argv[4])
    with open(os.path.join(directory, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    weights, file_dtypes = load_safetensors(os.path.join(directory, "model.safetensors"))
    ids = np.fromfile(batch_file, dtype="<i4")
    if ids.size != 2 * batch * seq:
        fail(f"{batch_file}: {ids.size} int32 values, expected 2 * {batch} * {seq}")
    tokens = torch.from_numpy(ids[: batch * seq].astype(np.int64)).reshape(batch, seq)
    targets = torch.from_numpy(ids[batch * seq :].astype(np.int64)).reshape(batch, seq)
    print(f"tensors={len(weights)} n_layer={config['n_layer']} n_head={config['n_head']} "
          f"n_embd={config['n_embd']} vocab_size={config['vocab_size']} batch={batch} seq={seq} "
          f"dtypes={','.join(sorted(file_dtypes))} torch={torch.__version__} (computing in float64)")
    with torch.no_grad():
        loss, logits = gpt2_loss(weights, config, tokens, targets)
        loss = loss.item()
    print(f"loss={loss:.17g}")
    if logits_out is not None:
        logits.numpy().astype("<f8").tofile(logits_out)
        print(f"logits={logits_out} ({logits.numel()} values)")
    other = transformers_loss(directory, tokens, targets)
    if other is not None:
        print(f"loss_transformers={other:.17g}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
