#!/usr/bin/env python3
"""A PyTorch peer of meshwork-train: the same Llama, the same data, the same optimizer and schedule.

It exists so that meshwork-train's tokens/s, MFU and peak memory can be set beside what plain
PyTorch (eager, or torch.compile) gets for the same work on the same GPU, and so that a loss
curve can be checked against an independent implementation (bench/peers/README.md).

What it mirrors, and where Meshwork defines it:
  model      trainer/model/llama.cpp, llama_config.cpp: presets, RMSNorm in fp32, RoPE in HF's
             rotate_half layout with Llama 3 rope scaling, grouped-query attention, SwiGLU, tied
             embeddings; Hugging Face parameter names; InitWeights (normal(0, std), residual
             projections std / sqrt(2 * layers), norm gains 1) after torch.manual_seed(seed).
  data       trainer/data/token_source.cpp: row r of step s is the window of seq + 1 tokens at
             RowHash(seed, s, r) mod (tokens - seq); synthetic token t of that row is
             SplitMix64(RowHash(seed, s, r) + t * golden) mod vocab. Both are reproduced exactly.
  optimizer  trainer/train/setup.cpp, schedule.cpp, config.cpp: AdamW (decay on matrices only),
             linear warmup then cosine to lr * 0.1, global-norm clipping, the same defaults.
  report     trainer/train/report.cpp: MFU = tokens/s * flops_per_token / peak, flops_per_token =
             6 * (N_non_embedding + vocab * hidden) + 12 * layers * hidden * seq (every attention
             score counted); the summary also gives mfu_causal, with the attention term halved
             (6 * layers * hidden * seq: the causal mask's half only), as llm.c counts.
  allocator  trainer/train/device.cpp: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True unless set.
"""

from __future__ import annotations

import argparse
import json
import math
import mmap
import os
import resource
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

# Before torch is imported, as meshwork-train sets it before anything touches CUDA: the caching
# allocator reads it once. Segments that grow in place instead of new fixed-size ones, so less
# memory is reserved and left fragmented. A value in the environment is kept.
os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F
from torch import nn

# --- model configuration (trainer/model/llama_config.cpp) ---------------------------------------


@dataclass(frozen=True)
class RopeScaling:
    """Llama 3's rope_scaling ("rope_type": "llama3"); factor 0 means none."""

    factor: float = 0.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    @property
    def enabled(self) -> bool:
        return self.factor > 0.0


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int = 320
    hidden_size: int = 128
    intermediate_size: int = 384
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 1024
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    tie_word_embeddings: bool = True

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def num_non_embedding_parameters(self) -> int:
        kv_dim = self.num_key_value_heads * self.head_dim
        attn = 2 * self.hidden_size * self.hidden_size + 2 * self.hidden_size * kv_dim
        mlp = 3 * self.hidden_size * self.intermediate_size
        norms = 2 * self.hidden_size
        return self.num_hidden_layers * (attn + mlp + norms) + self.hidden_size

    def num_parameters(self) -> int:
        embed = self.vocab_size * self.hidden_size
        return self.num_non_embedding_parameters() + embed * (1 if self.tie_word_embeddings else 2)

    def training_flops_per_token(self, seq_len: int, causal: bool = False) -> float:
        """Forward + backward FLOPs per token, as LlamaConfig::TrainingFlopsPerToken counts them:
        the attention scores and their products with V counted for every (query, key) pair.
        causal=True counts only the pairs the causal mask keeps (half), as llm.c does; the two
        conventions differ by 6 * layers * hidden * seq."""
        n = float(self.num_non_embedding_parameters())
        head = float(self.vocab_size) * float(self.hidden_size)
        attn = 12.0 * self.num_hidden_layers * self.hidden_size * seq_len
        return 6.0 * (n + head) + (attn / 2.0 if causal else attn)


PRESETS: dict[str, LlamaConfig] = {
    # Byte-level vocabulary (256 bytes + specials, padded to a multiple of 64).
    "tiny": LlamaConfig(),
    "llama-100m": LlamaConfig(
        vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
        num_attention_heads=12, num_key_value_heads=4, max_position_embeddings=2048),
    # Llama 3.2 1B
    "llama3-1b": LlamaConfig(
        vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=131072,
        rope_theta=500000.0, rope_scaling=RopeScaling(32.0, 1.0, 4.0, 8192)),
    # Llama 3 8B
    "llama3-8b": LlamaConfig(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
        rope_theta=500000.0, tie_word_embeddings=False),
}


def read_hf_config(directory: Path) -> LlamaConfig:
    """DIR/config.json as trainer/io/hf_checkpoint.cpp's ReadHfConfig reads it (same defaults)."""
    path = directory / "config.json"
    raw = json.loads(path.read_text())

    def get(key: str, default: object = None) -> object:
        value = raw.get(key)
        if value is None:
            if default is None:
                sys.exit(f"llama_peer: {path}: required key '{key}' is missing")
            return default
        return value

    scaling = RopeScaling()
    rs = raw.get("rope_scaling")
    if rs is not None:
        kind = rs.get("rope_type", rs.get("type"))
        if kind == "llama3":
            scaling = RopeScaling(float(rs["factor"]), float(rs["low_freq_factor"]),
                                  float(rs["high_freq_factor"]),
                                  int(rs["original_max_position_embeddings"]))
        elif kind != "default":
            sys.exit(f"llama_peer: {path}: rope_scaling type '{kind}' is not supported (llama3)")
    for key in ("attention_bias", "mlp_bias"):
        if raw.get(key):
            sys.exit(f"llama_peer: {path}: '{key}' is true; biases are not supported")
    heads = int(get("num_attention_heads"))
    return LlamaConfig(
        vocab_size=int(get("vocab_size")),
        hidden_size=int(get("hidden_size")),
        intermediate_size=int(get("intermediate_size")),
        num_hidden_layers=int(get("num_hidden_layers")),
        num_attention_heads=heads,
        num_key_value_heads=int(get("num_key_value_heads", heads)),
        max_position_embeddings=int(get("max_position_embeddings", 2048)),
        rms_norm_eps=float(get("rms_norm_eps", 1e-6)),
        rope_theta=float(get("rope_theta", 10000.0)),
        rope_scaling=scaling,
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
    )


# --- model (trainer/model/llama.cpp) --------------------------------------------------------------


HAS_RMS_NORM = hasattr(F, "rms_norm")  # PyTorch 2.4 on


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # fp32 in (the residual stream, even under autocast): PyTorch's own op, fused on CUDA.
        if x.dtype == torch.float32 and self.weight.dtype == torch.float32 and HAS_RMS_NORM:
            return F.rms_norm(x, (x.size(-1),), self.weight, self.eps)
        # Otherwise normalised in fp32 and cast back before the gain multiplies, as HF's
        # LlamaRMSNorm and Meshwork do.
        xf = x.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)


def rope_inverse_frequencies(c: LlamaConfig) -> torch.Tensor:
    """Rotary inverse frequencies in float64, with Llama 3's frequency-dependent scaling."""
    d = c.head_dim
    exponents = torch.arange(0, d, 2, dtype=torch.float64) / d
    inv_freq = 1.0 / torch.pow(c.rope_theta, exponents)
    s = c.rope_scaling
    if s.enabled:
        old_len = float(s.original_max_position_embeddings)
        low_wavelen = old_len / s.low_freq_factor
        high_wavelen = old_len / s.high_freq_factor
        wavelen = 2.0 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq)
        smooth = (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
        smoothed = (1.0 - smooth) * scaled / s.factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        inv_freq = torch.where(medium, smoothed, scaled)
    return inv_freq.float()


def rope_tables(c: LlamaConfig, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin), each [seq_len, head_dim] fp32: computed in float64, both halves alike."""
    inv_freq = rope_inverse_frequencies(c).double()
    freqs = torch.outer(torch.arange(seq_len, dtype=torch.float64), inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().float(), emb.sin().float()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [batch, heads, seq, head_dim]; the tables are cast to x's dtype first (as Meshwork)."""
    seq = x.size(-2)
    cos = cos[:seq].to(x.dtype)
    sin = sin[:seq].to(x.dtype)
    return x * cos + rotate_half(x) * sin


def sdpa_supports_gqa() -> bool:
    """F.scaled_dot_product_attention takes enable_gqa from PyTorch 2.5 on."""
    major, minor = (int(p) for p in torch.__version__.split(".")[:2])
    return (major, minor) >= (2, 5)


# --sdpa: meshwork-train's training.attention_backend values and SDPA's names for them.
SDPA_KERNELS = {"flash": "flash_attention", "cudnn": "cudnn_attention",
                "efficient": "efficient_attention", "math": "math"}


def restrict_sdpa(choice: str) -> None:
    """SDPA's own choice ("auto": every kernel enabled) or that kernel alone, process-wide, as
    meshwork-train's training.attention_backend does."""
    b = torch.backends.cuda
    b.enable_flash_sdp(choice in ("auto", "flash"))
    b.enable_mem_efficient_sdp(choice in ("auto", "efficient"))
    b.enable_math_sdp(choice in ("auto", "math"))
    if hasattr(b, "enable_cudnn_sdp"):
        b.enable_cudnn_sdp(choice in ("auto", "cudnn"))


def sdpa_kernel(c: LlamaConfig, seq: int, dtype: torch.dtype, device: torch.device) -> str:
    """The kernel SDPA takes for one sequence of the model laid out as forward() lays it out
    ([batch, seq, heads, dim] transposed), or why none can (as meshwork-train's kernels: line)."""
    choose = getattr(torch, "_fused_sdp_choice", None)
    if choose is None or not sdpa_supports_gqa():
        return "unknown (torch < 2.5)"

    def make(heads: int) -> torch.Tensor:
        return torch.empty(1, seq, heads, c.head_dim, device=device, dtype=dtype,
                           requires_grad=True).transpose(1, 2)
    grouped = c.num_key_value_heads != c.num_attention_heads
    try:
        index = choose(make(c.num_attention_heads), make(c.num_key_value_heads),
                       make(c.num_key_value_heads), is_causal=True, enable_gqa=grouped)
    except RuntimeError as e:
        return "none (" + str(e).splitlines()[0] + ")"
    names = {0: "math", 1: "flash_attention", 2: "efficient_attention", 3: "cudnn_attention"}
    return names.get(int(index), f"backend {index}")


def linear(n_in: int, n_out: int) -> nn.Linear:
    return nn.Linear(n_in, n_out, bias=False)


class Attention(nn.Module):
    def __init__(self, c: LlamaConfig, repeat_kv: bool) -> None:
        super().__init__()
        self.num_heads = c.num_attention_heads
        self.num_kv_heads = c.num_key_value_heads
        self.head_dim = c.head_dim
        # SDPA's enable_gqa lets the kernel share the K/V heads; --repeat-kv materialises the
        # repeated heads instead. Both give query head h the kv head h // (heads / kv_heads).
        self.repeat_kv = repeat_kv or not sdpa_supports_gqa()
        self.q_proj = linear(c.hidden_size, self.num_heads * self.head_dim)
        self.k_proj = linear(c.hidden_size, self.num_kv_heads * self.head_dim)
        self.v_proj = linear(c.hidden_size, self.num_kv_heads * self.head_dim)
        self.o_proj = linear(self.num_heads * self.head_dim, c.hidden_size)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        grouped = self.num_kv_heads != self.num_heads
        if grouped and self.repeat_kv:
            rep = self.num_heads // self.num_kv_heads
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
            grouped = False
        if grouped:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(b, t, self.num_heads * self.head_dim)
        return self.o_proj(y)


class Mlp(nn.Module):
    def __init__(self, c: LlamaConfig) -> None:
        super().__init__()
        self.gate_proj = linear(c.hidden_size, c.intermediate_size)
        self.up_proj = linear(c.hidden_size, c.intermediate_size)
        self.down_proj = linear(c.intermediate_size, c.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, c: LlamaConfig, repeat_kv: bool) -> None:
        super().__init__()
        # Registration order is Meshwork's: it fixes the order of the RNG draws at init.
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = Attention(c, repeat_kv)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = Mlp(c)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return h + self.mlp(self.post_attention_layernorm(h))


class LlamaModel(nn.Module):
    """HF's LlamaModel: embeddings, layers, final norm."""

    def __init__(self, c: LlamaConfig, repeat_kv: bool) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(c, repeat_kv) for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    """Parameter names are HF's ("model.layers.3.self_attn.q_proj.weight"), as Meshwork's are."""

    def __init__(self, c: LlamaConfig, rope_len: int, repeat_kv: bool = False) -> None:
        super().__init__()
        self.config = c
        self.model = LlamaModel(c, repeat_kv)
        self.lm_head = None if c.tie_word_embeddings else linear(c.hidden_size, c.vocab_size)
        # Made once for the run's sequence length (Meshwork caches them the same way); not
        # parameters, not saved.
        cos, sin = rope_tables(c, rope_len)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def output_weight(self) -> torch.Tensor:
        return self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens: int64 [batch, seq] -> logits [batch, seq, vocab]."""
        h = self.model.embed_tokens(tokens)
        for layer in self.model.layers:
            h = layer(h, self.rope_cos, self.rope_sin)
        h = self.model.norm(h)
        return torch.matmul(h, self.output_weight().t())


@torch.no_grad()
def init_weights(model: nn.Module, std: float, num_layers: int) -> None:
    """Meshwork's InitWeights: same rule, same parameter order, so the same draws after a seed."""
    residual_std = std / math.sqrt(2.0 * num_layers)
    for name, p in model.named_parameters():
        if p.dim() == 1:
            p.fill_(1.0)
        elif "o_proj" in name or "down_proj" in name:
            p.normal_(0.0, residual_std)
        else:
            p.normal_(0.0, std)


def causal_lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean token cross-entropy in fp32."""
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1))


LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def make_loss_fn(model: LlamaForCausalLM, compile_it: bool) -> LossFn:
    """(tokens, targets) -> mean loss: the model, its final norm and head, and the cross-entropy.
    With compile_it, torch.compile takes all of it as one region, so that Inductor can fuse the
    logits' cast to fp32 into the loss and its backward instead of keeping an fp32 copy of the
    logits (the largest activation at a 128k vocabulary); eager, the same ops run one by one."""
    def loss_fn(tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return causal_lm_loss(model(tokens), targets)
    return torch.compile(loss_fn) if compile_it else loss_fn


# --- Hugging Face weights (safetensors, read by hand) ------------------------------------------

SAFETENSORS_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16,
                      "F64": torch.float64}


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """An 8-byte little-endian header length N, N bytes of JSON, then the raw tensor bytes."""
    with path.open("rb") as f:
        header_len = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(header_len))
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    start = 8 + header_len
    tensors: dict[str, torch.Tensor] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        dtype = SAFETENSORS_DTYPES.get(entry["dtype"])
        if dtype is None:
            sys.exit(f"llama_peer: {path}: tensor '{name}' has dtype {entry['dtype']}, "
                     "not one of F32, BF16, F16, F64")
        begin, end = entry["data_offsets"]
        count = (end - begin) // torch.empty(0, dtype=dtype).element_size()
        flat = torch.frombuffer(data, dtype=dtype, count=count, offset=start + begin)
        tensors[name] = flat.reshape(entry["shape"]).clone()
    return tensors


def read_hf_weights(directory: Path) -> dict[str, torch.Tensor]:
    """model.safetensors, or the shards a model.safetensors.index.json lists."""
    single = directory / "model.safetensors"
    if single.exists():
        return read_safetensors(single)
    index = directory / "model.safetensors.index.json"
    if not index.exists():
        sys.exit(f"llama_peer: {directory} holds neither model.safetensors nor {index.name}")
    weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
    tensors: dict[str, torch.Tensor] = {}
    for shard in sorted(set(weight_map.values())):
        tensors.update(read_safetensors(directory / shard))
    return tensors


@torch.no_grad()
def load_hf_weights(model: LlamaForCausalLM, directory: Path) -> None:
    """Copies every parameter by name; missing, unexpected or misshapen tensors are an error."""
    stored = read_hf_weights(directory)
    params = dict(model.named_parameters())
    ignored = {n for n in stored if n.endswith("rotary_emb.inv_freq")}
    if model.config.tie_word_embeddings:
        ignored.add("lm_head.weight")
    missing = sorted(set(params) - set(stored))
    unexpected = sorted(set(stored) - set(params) - ignored)
    misshapen = sorted(n for n in set(params) & set(stored) if params[n].shape != stored[n].shape)
    if missing or unexpected or misshapen:
        sys.exit(f"llama_peer: {directory} does not match the model: missing {missing[:10]}, "
                 f"unexpected {unexpected[:10]}, shape mismatch {misshapen[:10]}")
    for name, p in params.items():
        p.copy_(stored[name])


# --- data (trainer/data/token_source.cpp, token_file.cpp) ---------------------------------------

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
LLMC_MAGIC = 20240520
LLMC_HEADER_BYTES = 1024


def splitmix64(x: int) -> int:
    z = (x + GOLDEN) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def row_hash(seed: int, step: int, row: int) -> int:
    """SplitMix64(SplitMix64(SplitMix64(seed) ^ step) ^ row)."""
    h = splitmix64(seed & MASK64)
    h = splitmix64(h ^ step)
    return splitmix64(h ^ row)


def splitmix64_array(x: np.ndarray) -> np.ndarray:
    """SplitMix64 over a uint64 array (numpy's unsigned arithmetic wraps modulo 2^64)."""
    z = x + np.uint64(GOLDEN)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def open_token_file(path: Path, token_format: str) -> np.ndarray:
    """The tokens of an llm.c, raw_u16 or raw_u32 file as a read-only memory map."""
    size = path.stat().st_size
    with path.open("rb") as f:
        head = np.frombuffer(f.read(min(size, LLMC_HEADER_BYTES)), dtype="<i4")
    if token_format == "auto":
        token_format = "llmc" if head.size >= 1 and head[0] == LLMC_MAGIC else "raw_u16"
    if token_format == "raw_u16":
        return np.memmap(path, dtype="<u2", mode="r")
    if token_format == "raw_u32":
        return np.memmap(path, dtype="<u4", mode="r")
    if head.size < 3 or head[0] != LLMC_MAGIC or head[1] not in (1, 2):
        sys.exit(f"llama_peer: {path} is not an llm.c token file (magic/version)")
    dtype = "<u2" if head[1] == 1 else "<u4"
    return np.memmap(path, dtype=dtype, mode="r", offset=LLMC_HEADER_BYTES, shape=(int(head[2]),))


Batch = tuple[torch.Tensor, torch.Tensor]


class FileTokenSource:
    """Row r of step s: the seq + 1 tokens at RowHash(seed, s, r) mod (tokens - seq)."""

    def __init__(self, tokens: np.ndarray, seq_len: int, vocab_size: int, seed: int) -> None:
        if tokens.size < seq_len + 1:
            sys.exit(f"llama_peer: the token file holds {tokens.size} tokens, fewer than seq + 1")
        self.tokens, self.seq_len, self.vocab_size, self.seed = tokens, seq_len, vocab_size, seed

    def rows(self, step: int, first_row: int, num_rows: int) -> Batch:
        starts = [row_hash(self.seed, step, first_row + r) % (self.tokens.size - self.seq_len)
                  for r in range(num_rows)]
        windows = np.stack([self.tokens[s:s + self.seq_len + 1] for s in starts]).astype(np.int64)
        if windows.max() >= self.vocab_size:
            sys.exit(f"llama_peer: token {windows.max()} at step {step} is outside the "
                     f"vocabulary ({self.vocab_size})")
        return split_windows(windows)


class SyntheticTokenSource:
    """Token t of row r at step s: SplitMix64(RowHash(seed, s, r) + t * golden) mod vocab."""

    def __init__(self, seq_len: int, vocab_size: int, seed: int) -> None:
        self.seq_len, self.vocab_size, self.seed = seq_len, vocab_size, seed
        self.offsets = np.arange(seq_len + 1, dtype=np.uint64) * np.uint64(GOLDEN)

    def rows(self, step: int, first_row: int, num_rows: int) -> Batch:
        hashes = np.array([row_hash(self.seed, step, first_row + r) for r in range(num_rows)],
                          dtype=np.uint64)
        windows = splitmix64_array(hashes[:, None] + self.offsets[None, :])
        windows %= np.uint64(self.vocab_size)
        return split_windows(windows.astype(np.int64))


def split_windows(windows: np.ndarray) -> Batch:
    w = torch.from_numpy(windows)
    return w[:, :-1].contiguous(), w[:, 1:].contiguous()


# --- optimizer and schedule (trainer/train/setup.cpp, schedule.cpp) -----------------------------


@dataclass(frozen=True)
class Schedule:
    steps: int
    warmup_steps: int
    min_lr_ratio: float = 0.1


def learning_rate(s: Schedule, base_lr: float, step: int) -> float:
    """Linear warmup ((step + 1) / warmup), then cosine to base_lr * min_lr_ratio at the end."""
    if step < s.warmup_steps:
        return base_lr * (step + 1) / s.warmup_steps
    min_lr = base_lr * s.min_lr_ratio
    decay_steps = s.steps - s.warmup_steps
    if decay_steps <= 1:
        return base_lr
    progress = min(max((step - s.warmup_steps) / (decay_steps - 1), 0.0), 1.0)
    return min_lr + 0.5 * (base_lr - min_lr) * (1.0 + math.cos(math.pi * progress))


def make_optimizer(model: nn.Module, args: argparse.Namespace, cuda: bool) -> torch.optim.AdamW:
    """AdamW with decoupled weight decay on matrices (embeddings included), none on norm gains."""
    params = list(model.parameters())
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": args.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    extra = {"fused": True} if cuda else {}
    return torch.optim.AdamW(groups, lr=args.lr, betas=(args.beta1, args.beta2), eps=args.eps,
                             **extra)


# --- measuring ------------------------------------------------------------------------------------


def peak_flops(device: torch.device, override_tflops: float) -> tuple[float, str]:
    """The MFU denominator and where it comes from, as trainer/train/device.cpp picks it."""
    if override_tflops > 0:
        return override_tflops * 1e12, "--peak-tflops"
    if device.type == "cpu":
        return measure_cpu_matmul_flops(), "measured fp32 matmul peak of this CPU"
    name = torch.cuda.get_device_name(device)
    # Dense bf16 tensor-core peaks from the datasheets (no sparsity).
    for key, tflops in (("H100", 989.4), ("H200", 989.4), ("A100", 312.0), ("L4", 121.0)):
        if key in name:
            return tflops * 1e12, f"datasheet dense bf16 peak of {name}"
    return 989.4e12, f"{name} unknown: H100's 989.4 TFLOP/s, as meshwork-train's auto profile"


def measure_cpu_matmul_flops() -> float:
    """Best of three 2048^3 fp32 matmuls, as meshwork-train measures a CPU."""
    n = 2048
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.matmul(a, b)  # warm-up
    best = 0.0
    for _ in range(3):
        t0 = time.perf_counter()
        torch.matmul(a, b)
        best = max(best, 2.0 * n ** 3 / (time.perf_counter() - t0))
    return best


def format_flops(flops: float) -> str:
    return f"{flops / 1e12:.1f} TFLOP/s" if flops >= 1e12 else f"{flops / 1e9:.1f} GFLOP/s"


@dataclass
class StepRecord:
    step: int
    loss: float
    lr: float
    grad_norm: float
    seconds: float


# --- the run --------------------------------------------------------------------------------------


def resolve_config(args: argparse.Namespace) -> tuple[LlamaConfig, str]:
    if args.init_from is None:
        return PRESETS[args.preset or "tiny"], args.preset or "tiny"
    config = read_hf_config(args.init_from)
    if args.preset is not None and PRESETS[args.preset] != config:
        sys.exit(f"llama_peer: --preset {args.preset} differs from {args.init_from}/config.json; "
                 "drop --preset (the dims come from the checkpoint)")
    return config, args.preset or f"hf:{args.init_from}"


def build_model(config: LlamaConfig, args: argparse.Namespace,
                device: torch.device) -> LlamaForCausalLM:
    """Built and initialised on the CPU after torch.manual_seed(seed), then moved (BuildModel)."""
    if args.seq > config.max_position_embeddings:
        sys.exit(f"llama_peer: --seq {args.seq} exceeds max_position_embeddings "
                 f"{config.max_position_embeddings}")
    torch.manual_seed(args.seed)
    model = LlamaForCausalLM(config, args.seq, repeat_kv=args.repeat_kv)
    if args.init_from is None:
        init_weights(model, args.init_std, config.num_hidden_layers)
    else:
        load_hf_weights(model, args.init_from)  # replaces every parameter: no init needed
    return model.to(device)


def make_source(args: argparse.Namespace,
                vocab_size: int) -> FileTokenSource | SyntheticTokenSource:
    if args.data is None:
        return SyntheticTokenSource(args.seq, vocab_size, args.seed)
    return FileTokenSource(open_token_file(args.data, args.token_format), args.seq, vocab_size,
                           args.seed)


def train_step(step: int, loss_fn: LossFn, params: list[nn.Parameter],
               optimizer: torch.optim.Optimizer, source: FileTokenSource | SyntheticTokenSource,
               args: argparse.Namespace, schedule: Schedule, device: torch.device) -> StepRecord:
    """One optimizer step in meshwork-train's order (trainer/train/trainer.cpp's TrainStep)."""
    t0 = time.perf_counter()
    lr = learning_rate(schedule, args.lr, step)
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.zero_grad(set_to_none=True)

    # Forward and backward, under bf16 autocast on CUDA unless --dtype fp32.
    inputs, targets = source.rows(step, 0, args.batch)
    autocast = device.type == "cuda" and args.dtype == "bf16"
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
        loss = loss_fn(inputs.to(device, non_blocking=True), targets.to(device, non_blocking=True))
    loss.backward()
    # Host-device sync: the loss is needed for the log and the divergence check (as in Meshwork).
    loss_value = loss.item()

    # Clip to the global norm (an infinite limit only measures it), then step.
    max_norm = args.grad_clip if args.grad_clip > 0 else math.inf
    # Another sync, as libtorch's clip_grad_norm_ (which returns a double) makes in Meshwork.
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
    optimizer.step()
    if not math.isfinite(loss_value):
        sys.exit(f"llama_peer: training diverged: loss is {loss_value} at step {step + 1}")
    return StepRecord(step, loss_value, lr, grad_norm, time.perf_counter() - t0)


def peak_memory(device: torch.device) -> str:
    if device.type == "cuda":
        gib = 1 << 30
        return (f"peak_alloc_gib={torch.cuda.max_memory_allocated(device) / gib:.2f} "
                f"peak_reserved_gib={torch.cuda.max_memory_reserved(device) / gib:.2f}")
    # ru_maxrss is in KiB on Linux.
    return f"peak_rss_gib={resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1 << 20):.2f}"


def run(args: argparse.Namespace) -> int:
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("llama_peer: --device cuda but torch sees no CUDA device")
    if device.type == "cpu" and args.dtype == "bf16":
        sys.exit("llama_peer: --dtype bf16 is autocast on CUDA; use --dtype fp32 on the CPU")
    config, name = resolve_config(args)
    flops_per_token = config.training_flops_per_token(args.seq)
    flops_per_token_causal = config.training_flops_per_token(args.seq, causal=True)
    print(f"model: {name}, {config.num_parameters() / 1e6:.2f}M parameters "
          f"({config.num_hidden_layers} layers, hidden {config.hidden_size}, heads "
          f"{config.num_attention_heads}/{config.num_key_value_heads}, vocab {config.vocab_size}), "
          f"flops_per_token={flops_per_token:.6g} flops_per_token_causal="
          f"{flops_per_token_causal:.6g}", flush=True)
    if args.dry_run:
        return 0

    restrict_sdpa(args.sdpa)
    attention = sdpa_kernel(config, args.seq, torch.bfloat16 if args.dtype == "bf16" else torch.float32,
                            device)
    if args.sdpa != "auto" and attention != SDPA_KERNELS[args.sdpa]:
        sys.exit(f"llama_peer: --sdpa {args.sdpa} cannot run this model's attention on {device}: "
                 f"{attention}")
    model = build_model(config, args, device)
    params = list(model.parameters())
    optimizer = make_optimizer(model, args, device.type == "cuda")
    loss_fn = make_loss_fn(model, args.compile)
    source = make_source(args, config.vocab_size)
    warmup = min(20, args.steps) if args.warmup is None else args.warmup
    schedule = Schedule(args.steps, warmup)
    peak, basis = peak_flops(device, args.peak_tflops)
    tokens_per_step = args.batch * args.seq
    allocator = ""
    if device.type == "cuda":
        allocator = f"; allocator {os.environ.get('PYTORCH_CUDA_ALLOC_CONF')}"
    print(f"data: {'synthetic' if args.data is None else args.data}, seed {args.seed}, batch "
          f"{args.batch} x seq {args.seq} = {tokens_per_step} tokens/step; device {device} "
          f"({args.dtype}{', torch.compile of model + loss' if args.compile else ', eager'}), "
          f"torch {torch.__version__}; attention {attention} (--sdpa {args.sdpa}); mfu vs "
          f"{format_flops(peak)} ({basis}){allocator}", flush=True)

    records: list[StepRecord] = []
    for step in range(args.steps):
        r = train_step(step, loss_fn, params, optimizer, source, args, schedule, device)
        records.append(r)
        print(f"step {step + 1}/{args.steps} | loss {r.loss:.4f} | lr {r.lr:.2e} | grad_norm "
              f"{r.grad_norm:.3f} | {tokens_per_step / r.seconds:.0f} tok/s | "
              f"{r.seconds * 1e3:.1f} ms", flush=True)
    if args.losses_out is not None:
        args.losses_out.write_text("".join(f"{r.loss:.17g}\n" for r in records))

    # Steady state: steps after --skip (allocator warm-up, compilation).
    steady = records[args.skip:] if len(records) > args.skip else records[-1:]
    tps = tokens_per_step * len(steady) / sum(r.seconds for r in steady)
    mfu = tps * flops_per_token / peak
    mfu_causal = tps * flops_per_token_causal / peak
    print(f"peer: preset={name} device={device.type} dtype={args.dtype} "
          f"compile={int(args.compile)} batch={args.batch} seq={args.seq} steps={args.steps} "
          f"steady_from={len(records) - len(steady) + 1} sdpa={attention.split()[0]} tok/s={tps:.0f} "
          f"mfu={mfu * 100:.2f}% mfu_causal={mfu_causal * 100:.2f}% "
          f"{peak_memory(device)} final_loss={records[-1].loss:.4f}", flush=True)
    return 0


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Train meshwork-train's Llama with plain PyTorch on the same data, for "
                    "side-by-side tokens/s, MFU, peak memory and loss curves.",
        epilog="Defaults are meshwork-train's (docs/config.md). Without --data the tokens are "
               "Meshwork's synthetic ones, reproduced exactly. Output: one line per step and a "
               "final 'peer: key=value ...' line.")
    p.add_argument("--preset", choices=sorted(PRESETS), default=None,
                   help="model preset (default tiny; with --init-from, the checkpoint's dims)")
    p.add_argument("--init-from", type=Path, default=None, metavar="DIR",
                   help="Hugging Face directory (config.json + model.safetensors) to start from, "
                        "e.g. one meshwork-train's checkpoint.export_hf wrote")
    p.add_argument("--batch", type=int, default=16, help="sequences per step (data.batch_size)")
    p.add_argument("--seq", type=int, default=128, help="tokens per sequence (data.seq_len)")
    p.add_argument("--steps", type=int, default=200, help="optimizer steps (schedule.steps)")
    p.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (optimizer.lr)")
    p.add_argument("--warmup", type=int, default=None,
                   help="warmup steps (schedule.warmup_steps; default min(20, --steps))")
    p.add_argument("--weight-decay", type=float, default=0.1, help="on matrices only")
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.95)
    p.add_argument("--eps", type=float, default=1e-8)
    p.add_argument("--grad-clip", type=float, default=1.0, help="global L2 norm; 0 = no clipping")
    p.add_argument("--init-std", type=float, default=0.02, help="model.init_std")
    p.add_argument("--seed", type=int, default=1234,
                   help="training.seed: the init's torch.manual_seed and the data's seed")
    p.add_argument("--data", type=Path, default=None, metavar="FILE",
                   help="Meshwork token file (llm.c, raw_u16 or raw_u32); default synthetic")
    p.add_argument("--token-format", choices=["auto", "llmc", "raw_u16", "raw_u32"],
                   default="auto", help="data.token_format")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                   help="cuda, cuda:N or cpu")
    p.add_argument("--dtype", choices=["bf16", "fp32"], default=None,
                   help="bf16 = fp32 weights + bf16 autocast (CUDA; the default there); fp32")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile the model together with its loss (final norm, head, "
                        "cross-entropy); the optimizer stays eager")
    p.add_argument("--repeat-kv", action="store_true",
                   help="materialise the repeated K/V heads (as Meshwork's attention did up to "
                        "commit 0c347d9) instead of SDPA's enable_gqa")
    p.add_argument("--sdpa", choices=["auto", *SDPA_KERNELS], default="auto",
                   help="attention kernel: SDPA's own choice, or that kernel alone "
                        "(meshwork-train's training.attention_backend)")
    p.add_argument("--threads", type=int, default=0, help="CPU intra-op threads (0 = torch's)")
    p.add_argument("--skip", type=int, default=2,
                   help="steps left out of the summary's tokens/s (warm-up, compilation)")
    p.add_argument("--peak-tflops", type=float, default=0.0,
                   help="MFU denominator in TFLOP/s (default: the GPU's dense bf16 datasheet peak)")
    p.add_argument("--losses-out", type=Path, default=None, metavar="FILE",
                   help="write each step's loss, one a line")
    p.add_argument("--dry-run", action="store_true",
                   help="print the model line (parameters, flops_per_token in both attention "
                        "conventions) and exit")
    args = p.parse_args(argv)
    if args.dtype is None:
        args.dtype = "bf16" if args.device.startswith("cuda") else "fp32"
    if args.warmup is not None and not 0 <= args.warmup <= args.steps:
        p.error(f"--warmup {args.warmup} must be in [0, --steps]")
    for key in ("batch", "seq", "steps"):
        if getattr(args, key) < 1:
            p.error(f"--{key} must be >= 1")
    return args


def main() -> int:
    args = parse_args()
    try:
        return run(args)
    except torch.cuda.OutOfMemoryError as e:
        # A distinct line and exit code, so a benchmark can record OOM and go on.
        first = str(e).splitlines()[0] if str(e) else "out of memory"
        print(f"peer: preset={args.preset} batch={args.batch} seq={args.seq} "
              f"compile={int(args.compile)} result=oom ({first})", flush=True)
        return 7


if __name__ == "__main__":
    sys.exit(main())
