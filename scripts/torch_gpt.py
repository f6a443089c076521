#!/usr/bin/env python3
"""The same GPT as braid-train, in eager PyTorch, for the throughput comparison
of issue 7 (run on the GPU machine, which has PyTorch; braid does not need it).

Same shapes (byte vocabulary of 256, tied embedding, pre-LayerNorm blocks,
tanh GELU, causal attention), AdamW with the same hyper-parameters, fp32 with
TF32 off (what braid's kernels compute), and the same FLOPs per token
(6 N + 12 n_layer n_embd T, N without the position embedding), so the
tokens/s and MFU printed are comparable with braid-train's summary line.
Attention is PyTorch's own choice (scaled_dot_product_attention) or, with
--naive-attention, materialised softmax(QK^T)V as braid computes it.

  python3 scripts/torch_gpt.py --n-layer 6 --n-head 6 --n-embd 384 --block-size 256 --batch-size 8
"""
import argparse
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, H, naive):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.c_attn, self.attn_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.c_fc, self.mlp_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)
        self.H, self.naive = H, naive

    def attention(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.H, C // self.H).transpose(1, 2) for t in (q, k, v))
        if self.naive:
            att = (q @ k.transpose(-2, -1)) / math.sqrt(C // self.H)
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
            y = att @ v
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.attn_proj(y.transpose(1, 2).contiguous().view(B, T, C))

    def forward(self, x):
        x = x + self.attention(self.ln_1(x))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, L, H, C, T, V=256, naive=False):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
        self.blocks = nn.ModuleList(Block(C, H, naive) for _ in range(L))
        self.ln_f = nn.LayerNorm(C)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def main():
    p = argparse.ArgumentParser()
    for name, default in [("n-layer", 6), ("n-head", 6), ("n-embd", 384), ("block-size", 256),
                          ("batch-size", 8), ("steps", 20), ("warmup", 3)]:
        p.add_argument("--" + name, type=int, default=default)
    p.add_argument("--naive-attention", action="store_true")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    a = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(1337)
    dev = "cuda"
    model = Gpt(a.n_layer, a.n_head, a.n_embd, a.block_size, naive=a.naive_attention).to(dev)
    step_fn = torch.compile(model) if a.compile else model
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    params = sum(p.numel() for p in model.parameters())
    flops_per_token = 6 * (params - a.block_size * a.n_embd) + 12 * a.n_layer * a.n_embd * a.block_size
    data = torch.randint(0, 256, (a.batch_size, a.block_size + 1), device=dev)
    x, y = data[:, :-1].contiguous(), data[:, 1:].contiguous()
    for i in range(a.warmup + a.steps):
        if i == a.warmup:
            torch.cuda.synchronize()
            start = time.perf_counter()
        loss = step_fn(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    tokens_per_s = a.steps * a.batch_size * a.block_size / seconds
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}: {params / 1e6:.1f}M parameters, "
          f"{tokens_per_s:.0f} tokens/s, {flops_per_token * tokens_per_s * 1e-12:.2f} TFLOP/s "
          f"(attention {'naive' if a.naive_attention else 'sdpa'}{', compiled' if a.compile else ''}; "
          f"peak memory {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB)")


if __name__ == "__main__":
    main()
