"""Small models shared by the tests."""

import torch
from torch import nn


def mlp(d_in: int = 6, hidden: int = 16, d_out: int = 3) -> nn.Sequential:
    return nn.Sequential(nn.Linear(d_in, hidden), nn.GELU(), nn.Linear(hidden, d_out))


class Attention(nn.Module):
    """Causal self-attention from separate q/k/v/o nn.Linear layers."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, dim = x.shape
        split = lambda y: y.view(b, t, self.heads, dim // self.heads).transpose(1, 2)
        att = nn.functional.scaled_dot_product_attention(
            split(self.q(x)), split(self.k(x)), split(self.v(x)), is_causal=True
        )
        return self.o(att.transpose(1, 2).reshape(b, t, dim))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyTransformer(nn.Module):
    """Token ids ``(n, t)`` -> logits ``(n, t, vocab)``."""

    def __init__(self, vocab: int = 11, dim: int = 16, heads: int = 2, depth: int = 2, seq: int = 8):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(seq, dim) * 0.1)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(depth))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def routed_call(model, router, adapters, num, args, kwargs, device=None, **routing):
    """One routed forward through the routing front end: ``parse_route`` then ``run_route``."""
    from populora.routing import RoutingTarget, parse_route, run_route

    return run_route(RoutingTarget(model, router, adapters, num, device), parse_route(num, **routing), args, kwargs)
