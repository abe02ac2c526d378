"""Qwen3-TTS talker and residual code predictor, written for export.

A readable port of qwen-tts 0.1.1 `modeling_qwen3_tts.py` (talker + code predictor), shaped for
ONNX export and a runtime that owns its buffers:

- `TalkerPrefill`: one request's whole prefill -> last hidden, sampled code 0, the new K/V rows.
- `TalkerDecode`: one step for a batch over a KV cache the runtime allocated once; it returns only
  the new K/V rows, which the host writes at each row's position (no scatter, no concat of caches).
- `CodePredictorFrame`: the whole residual frame (groups 1..G-1) unrolled, with sampling inside,
  plus the codec-embedding sum that the next talker step takes as input.

Text-only inputs give three equal M-RoPE position rows, so the interleaved multimodal RoPE of the
reference is plain 1-D RoPE here. Sampling follows HF's processor order (see `process_code0` and
`sample`). The K cache is stored transposed, [B, Hkv, D, S], so decode attention is two plain
MatMuls over the cache with no transpose of the cache in the graph.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn

NEG_INF = float("-inf")
SPECIALS_PER_VOCAB = 1024  # the reference suppresses [vocab - 1024, vocab) except eos


# ----------------------------------------------------------------------------------------- config


@dataclass(frozen=True)
class StackConfig:
    """One decoder-only transformer stack (talker or code predictor)."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    rms_eps: float
    rope_theta: float


@dataclass(frozen=True)
class Qwen3TTSConfig:
    talker: StackConfig
    predictor: StackConfig
    vocab: int  # talker codec vocabulary (codes + specials)
    codebook_size: int  # code predictor vocabulary
    code_groups: int
    text_vocab: int
    text_hidden: int
    special: dict[str, int]
    speakers: dict[str, dict]
    languages: dict[str, int]
    model_type: str = "custom_voice"
    instruct: bool = True  # qwen-tts drops instruct for the 0.6B CustomVoice model ("0b6")
    sampling: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_checkpoint(cls, checkpoint: Path) -> Qwen3TTSConfig:
        cfg = _read_json(checkpoint / "config.json")
        t = _key(cfg, "talker_config", "config.json")
        cp = _key(t, "code_predictor_config", "config.json: talker_config")
        for where, c in (("talker_config", t), ("code_predictor_config", cp)):
            if c.get("attention_bias"):
                raise ValueError(f"config.json: {where}.attention_bias=true is not supported")
        if cp.get("num_code_groups", t["num_code_groups"]) != t["num_code_groups"]:
            raise ValueError("config.json: code_predictor_config.num_code_groups differs from the talker's")
        model_type = cfg.get("tts_model_type") or "custom_voice"
        if model_type not in ("custom_voice", "voice_design"):
            raise ValueError(f"config.json: tts_model_type {model_type!r} is not supported (custom_voice, voice_design)")
        size = cfg.get("tts_model_size")
        gen = _read_json(checkpoint / "generation_config.json") if (checkpoint / "generation_config.json").exists() else {}
        dialects = t.get("spk_is_dialect") or {}
        return cls(
            talker=_stack(t, "talker_config"),
            predictor=_stack(cp, "code_predictor_config"),
            vocab=t["vocab_size"],
            codebook_size=cp["vocab_size"],
            code_groups=t["num_code_groups"],
            text_vocab=_key(t, "text_vocab_size", "config.json: talker_config"),
            text_hidden=t["text_hidden_size"],
            special={
                "codec_pad": t["codec_pad_id"], "codec_bos": t["codec_bos_id"],
                "codec_eos": t["codec_eos_token_id"], "codec_think": t["codec_think_id"],
                "codec_nothink": t["codec_nothink_id"], "codec_think_bos": t["codec_think_bos_id"],
                "codec_think_eos": t["codec_think_eos_id"],
                "tts_pad": cfg["tts_pad_token_id"], "tts_bos": cfg["tts_bos_token_id"],
                "tts_eos": cfg["tts_eos_token_id"], "im_start": cfg["im_start_token_id"],
                "im_end": cfg["im_end_token_id"],
            },
            speakers={
                name.lower(): {"id": int(i), "dialect": dialects.get(name) or None}
                for name, i in (t.get("spk_id") or {}).items()
            },
            languages={k.lower(): int(v) for k, v in (t.get("codec_language_id") or {}).items()},
            model_type=model_type,
            # the wrapper's own test, a substring check: `if tts_model_size in "0b6": instruct = None`
            instruct=not (model_type == "custom_voice" and isinstance(size, str) and size in "0b6"),
            sampling={
                "temperature": gen.get("temperature", 0.9), "top_k": gen.get("top_k", 50),
                "top_p": gen.get("top_p", 1.0), "repetition_penalty": gen.get("repetition_penalty", 1.05),
                "cp_temperature": gen.get("subtalker_temperature", 0.9),
                "cp_top_k": gen.get("subtalker_top_k", 50), "cp_top_p": gen.get("subtalker_top_p", 1.0),
            },
        )


def _read_json(path: Path) -> dict:
    if not path.exists():
        raise FileNotFoundError(f"{path.name}: missing from the checkpoint")
    return json.loads(path.read_text())


def _key(d: dict, key: str, where: str):
    if key not in d:
        raise KeyError(f"{where}: missing key {key!r}")
    return d[key]


def _stack(c: dict, where: str) -> StackConfig:
    heads = c["num_attention_heads"]
    return StackConfig(
        hidden=c["hidden_size"], layers=c["num_hidden_layers"], heads=heads,
        kv_heads=c.get("num_key_value_heads") or heads,
        head_dim=c.get("head_dim") or c["hidden_size"] // heads,
        intermediate=c["intermediate_size"], rms_eps=c.get("rms_norm_eps", 1e-6),
        rope_theta=c.get("rope_theta", 10000.0),
    )


# ----------------------------------------------------------------------------------------- blocks


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rope_tables(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin for float positions [...] -> [..., D], computed as HF computes them (float32)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    freqs = positions.float().unsqueeze(-1) * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, c: StackConfig):
        super().__init__()
        self.c = c
        self.q_proj = nn.Linear(c.hidden, c.heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(c.hidden, c.kv_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(c.hidden, c.kv_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.heads * c.head_dim, c.hidden, bias=False)
        self.q_norm = RMSNorm(c.head_dim, c.rms_eps)
        self.k_norm = RMSNorm(c.head_dim, c.rms_eps)

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """x [B, T, H] -> q [B, Hq, T, D], k [B, Hkv, T, D], v [B, Hkv, T, D], rotated."""
        b, t, _ = x.shape
        c = self.c
        q = self.q_norm(self.q_proj(x).view(b, t, c.heads, c.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(b, t, c.kv_heads, c.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(b, t, c.kv_heads, c.head_dim).transpose(1, 2)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def causal(self, x, cos, sin, past_k=None, past_v=None):
        """Full causal attention over (optional past) + x. Returns out [B,T,H], k, v of x's rows."""
        q, k, v = self.project(x, cos, sin)
        keys = k if past_k is None else torch.cat((past_k, k), dim=2)
        values = v if past_v is None else torch.cat((past_v, v), dim=2)
        rep = self.c.heads // self.c.kv_heads
        keys_r = keys.repeat_interleave(rep, dim=1)
        values_r = values.repeat_interleave(rep, dim=1)
        t, s = q.shape[2], keys.shape[2]
        scores = torch.matmul(q, keys_r.transpose(2, 3)) * self.c.head_dim**-0.5  # [B, Hq, T, S]
        row = torch.arange(t).unsqueeze(1) + (s - t)
        col = torch.arange(s).unsqueeze(0)
        scores = scores.masked_fill(col > row, NEG_INF)
        out = torch.matmul(torch.softmax(scores, dim=-1), values_r)  # [B, Hq, T, D]
        return self.o_proj(out.transpose(1, 2).reshape(x.shape[0], t, -1)), k, v

    def step(self, x, cos, sin, past_kt, past_v, valid):
        """One new row per batch member over a cache.

        x [B, 1, H]; past_kt [B, Hkv, D, S] (transposed keys); past_v [B, Hkv, S, D];
        valid [B, 1, 1, S] bool (cache slots before the row's position). Grouped-query heads are
        folded into the query rows so the cache is read once, never repeated or transposed.
        """
        c = self.c
        b = x.shape[0]
        rep = c.heads // c.kv_heads
        q, k, v = self.project(x, cos, sin)  # q [B, Hq, 1, D], k/v [B, Hkv, 1, D]
        scale = c.head_dim**-0.5
        q = q.reshape(b, c.kv_heads, rep, c.head_dim)  # [B, Hkv, rep, D]
        past_scores = torch.matmul(q, past_kt) * scale  # [B, Hkv, rep, S]
        past_scores = torch.where(valid, past_scores, torch.full_like(past_scores, NEG_INF))
        new_score = torch.matmul(q, k.transpose(2, 3)) * scale  # [B, Hkv, rep, 1]
        weights = torch.softmax(torch.cat((past_scores, new_score), dim=-1), dim=-1)
        s = past_scores.shape[-1]
        out = torch.matmul(weights[..., :s], past_v) + weights[..., s:] * v  # [B, Hkv, rep, D]
        return self.o_proj(out.reshape(b, 1, c.heads * c.head_dim)), k, v


class MLP(nn.Module):
    def __init__(self, c: StackConfig):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden, c.intermediate, bias=False)
        self.up_proj = nn.Linear(c.hidden, c.intermediate, bias=False)
        self.down_proj = nn.Linear(c.intermediate, c.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, c: StackConfig):
        super().__init__()
        self.self_attn = Attention(c)
        self.mlp = MLP(c)
        self.input_layernorm = RMSNorm(c.hidden, c.rms_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden, c.rms_eps)

    def finish(self, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        x = x + attn
        return x + self.mlp(self.post_attention_layernorm(x))


class Stack(nn.Module):
    """Layers + final norm; weights named as in the checkpoint under `<prefix>.layers.*`."""

    def __init__(self, c: StackConfig):
        super().__init__()
        self.c = c
        self.layers = nn.ModuleList(Block(c) for _ in range(c.layers))
        self.norm = RMSNorm(c.hidden, c.rms_eps)

    def causal(self, x, positions, past=None):
        """x [B, T, H] at positions [T]; past: list of (k, v) per layer or None. Returns h, [(k, v)]."""
        cos, sin = rope_tables(positions, self.c.head_dim, self.c.rope_theta)
        rows = []
        for i, layer in enumerate(self.layers):
            pk, pv = past[i] if past is not None else (None, None)
            attn, k, v = layer.self_attn.causal(layer.input_layernorm(x), cos, sin, pk, pv)
            x = layer.finish(x, attn)
            rows.append((k, v))
        return self.norm(x), rows


# ----------------------------------------------------------------------------------------- sampling


def process_code0(logits, seen, repetition_penalty, allow_eos, eos: int):
    """Repetition penalty over earlier code-0 tokens, then suppress specials (and eos until allowed).

    logits [B, V]; seen [B, V] (1.0 where the token was generated before); allow_eos [B] bool.
    """
    vocab = logits.shape[-1]
    penalty = repetition_penalty.unsqueeze(-1)
    penalized = torch.where(logits < 0, logits * penalty, logits / penalty)
    logits = torch.where(seen > 0, penalized, logits)
    ids = torch.arange(vocab)
    suppressed = (ids >= vocab - SPECIALS_PER_VOCAB) & (ids != eos)  # [V]
    eos_blocked = (ids == eos).unsqueeze(0) & ~allow_eos.unsqueeze(-1)  # [B, V]
    return torch.where(suppressed.unsqueeze(0) | eos_blocked, torch.full_like(logits, NEG_INF), logits)


def sample(logits, temperature, top_k, top_p, noise):
    """Temperature -> top-k -> top-p -> Gumbel-max, per row; temperature <= 0 is greedy (argmax).

    logits [..., V]; temperature/top_k/top_p broadcast over the leading dims; noise [..., V] uniform.
    HF's top-p removes a token when the ascending cumulative probability up to it is <= 1 - top_p,
    i.e. when the probability mass strictly above it (in descending order) is >= top_p.
    """
    vocab = logits.shape[-1]
    greedy = temperature <= 0
    t = torch.where(greedy, torch.ones_like(temperature), temperature).unsqueeze(-1)
    scaled = logits / t
    ordered, _ = torch.sort(scaled, dim=-1, descending=True)
    k = torch.where((top_k <= 0) | (top_k > vocab), torch.full_like(top_k, vocab), top_k)
    in_top_k = torch.arange(vocab) < k.unsqueeze(-1)
    ordered = torch.where(in_top_k, ordered, torch.full_like(ordered, NEG_INF))
    probs = torch.softmax(ordered, dim=-1)
    mass_above = torch.cumsum(probs, dim=-1) - probs
    keep = in_top_k & ((mass_above < top_p.unsqueeze(-1)) | (top_p.unsqueeze(-1) >= 1.0))
    kept = keep.sum(-1, keepdim=True).clamp(min=1)  # keep is a prefix: its length picks the threshold
    threshold = torch.gather(ordered, -1, kept - 1)
    filtered = torch.where(scaled < threshold, torch.full_like(scaled, NEG_INF), scaled)
    gumbel = -torch.log(-torch.log(noise))
    score = torch.where(greedy.unsqueeze(-1), logits, filtered + gumbel)
    return torch.argmax(score, dim=-1)


# ----------------------------------------------------------------------------------------- graphs


class Talker(nn.Module):
    """Talker weights: the stack, codec head. Prefill and decode are two views over it."""

    def __init__(self, cfg: Qwen3TTSConfig):
        super().__init__()
        self.cfg = cfg
        self.model = Stack(cfg.talker)
        self.codec_head = nn.Linear(cfg.talker.hidden, cfg.vocab, bias=False)


class TalkerPrefill(nn.Module):
    def __init__(self, talker: Talker):
        super().__init__()
        self.talker = talker

    def forward(self, inputs_embeds, seen, repetition_penalty, allow_eos, temperature, top_k, top_p, noise):
        # inputs_embeds [1, T, H]
        t = inputs_embeds.shape[1]
        h, rows = self.talker.model.causal(inputs_embeds, torch.arange(t).unsqueeze(0))
        hidden = h[:, -1]  # [1, H]
        logits = process_code0(self.talker.codec_head(hidden), seen, repetition_penalty, allow_eos,
                               self.talker.cfg.special["codec_eos"])
        code0 = sample(logits, temperature, top_k, top_p, noise)
        kv = [x for k, v in rows for x in (k.transpose(2, 3), v)]  # keys as [1, Hkv, D, T]
        return (hidden, code0, *kv)


class TalkerDecode(nn.Module):
    def __init__(self, talker: Talker):
        super().__init__()
        self.talker = talker

    def forward(self, inputs_embeds, positions, seen, repetition_penalty, allow_eos,
                temperature, top_k, top_p, noise, *cache):
        # inputs_embeds [B, H]; positions [B]; cache = past_keys_0 [B,Hkv,D,S], past_values_0 [B,Hkv,S,D], ...
        stack = self.talker.model
        x = inputs_embeds.unsqueeze(1)
        cos, sin = rope_tables(positions.unsqueeze(1), stack.c.head_dim, stack.c.rope_theta)  # [B, 1, D]
        slots = cache[1].shape[2]
        valid = (torch.arange(slots).unsqueeze(0) < positions.unsqueeze(1)).view(-1, 1, 1, slots)
        new_rows = []
        for i, layer in enumerate(stack.layers):
            attn, k, v = layer.self_attn.step(layer.input_layernorm(x), cos, sin,
                                              cache[2 * i], cache[2 * i + 1], valid)
            x = layer.finish(x, attn)
            new_rows += [k.transpose(2, 3), v]  # [B, Hkv, D, 1], [B, Hkv, 1, D]
        hidden = stack.norm(x)[:, 0]
        logits = process_code0(self.talker.codec_head(hidden), seen, repetition_penalty, allow_eos,
                               self.talker.cfg.special["codec_eos"])
        code0 = sample(logits, temperature, top_k, top_p, noise)
        return (hidden, code0, *new_rows)


class CodePredictorFrame(nn.Module):
    """Groups 1..G-1 of one frame from the talker hidden and code 0; a fresh 16-slot cache per frame."""

    def __init__(self, cfg: Qwen3TTSConfig):
        super().__init__()
        self.cfg = cfg
        g = cfg.code_groups
        self.codec_embedding = nn.Embedding(cfg.vocab, cfg.talker.hidden)  # the talker's table
        self.model = Stack(cfg.predictor)
        self.cp_embedding = nn.ModuleList(nn.Embedding(cfg.codebook_size, cfg.talker.hidden) for _ in range(g - 1))
        self.lm_head = nn.ModuleList(nn.Linear(cfg.predictor.hidden, cfg.codebook_size, bias=False) for _ in range(g - 1))
        if cfg.predictor.hidden != cfg.talker.hidden:
            self.small_to_mtp_projection = nn.Linear(cfg.talker.hidden, cfg.predictor.hidden, bias=True)
        else:
            self.small_to_mtp_projection = nn.Identity()

    def forward(self, hidden, code0, temperature, top_k, top_p, noise):
        # hidden [B, H]; code0 [B]; noise [B, G-1, Vc]
        e0 = self.codec_embedding(code0)  # [B, H]
        codec_sum = e0
        x = self.small_to_mtp_projection(torch.stack((hidden, e0), dim=1))  # [B, 2, Hc]
        h, past = self.model.causal(x, torch.arange(2).unsqueeze(0))
        codes = []
        for g in range(self.cfg.code_groups - 1):
            code = sample(self.lm_head[g](h[:, -1]), temperature, top_k, top_p, noise[:, g])
            codes.append(code)
            e = self.cp_embedding[g](code)  # [B, H], unprojected for the talker's sum
            codec_sum = codec_sum + e
            if g + 1 < self.cfg.code_groups - 1:
                x = self.small_to_mtp_projection(e.unsqueeze(1))
                h, rows = self.model.causal(x, torch.tensor([[g + 2]]), past)
                past = [(torch.cat((pk, k), dim=2), torch.cat((pv, v), dim=2)) for (pk, pv), (k, v) in zip(past, rows)]
        return torch.stack(codes, dim=1), codec_sum


# ----------------------------------------------------------------------------------------- loading


def load_qwen3_tts(checkpoint: Path) -> tuple[Qwen3TTSConfig, Talker, CodePredictorFrame, dict[str, torch.Tensor]]:
    """Config, talker, code predictor and the host-side tables, from a checkpoint directory.

    Every weight the modules need must be present: a missing key is an error naming it.
    """
    checkpoint = Path(checkpoint)
    cfg = Qwen3TTSConfig.from_checkpoint(checkpoint)
    files = sorted(checkpoint.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{checkpoint}: no *.safetensors weights")
    weights: dict[str, torch.Tensor] = {}
    for f in files:
        weights.update({k: v.float() for k, v in load_file(f).items()})

    talker = Talker(cfg)
    _load(talker, weights, {"model.": "talker.model.", "codec_head.": "talker.codec_head."})
    predictor = CodePredictorFrame(cfg)
    _load(predictor, weights, {
        "codec_embedding.": "talker.model.codec_embedding.",
        "model.": "talker.code_predictor.model.",
        "cp_embedding.": "talker.code_predictor.model.codec_embedding.",
        "lm_head.": "talker.code_predictor.lm_head.",
        "small_to_mtp_projection.": "talker.code_predictor.small_to_mtp_projection.",
    })
    tables = {
        "text_embedding": _need(weights, "talker.model.text_embedding.weight"),
        "text_projection.fc1.weight": _need(weights, "talker.text_projection.linear_fc1.weight"),
        "text_projection.fc1.bias": _need(weights, "talker.text_projection.linear_fc1.bias"),
        "text_projection.fc2.weight": _need(weights, "talker.text_projection.linear_fc2.weight"),
        "text_projection.fc2.bias": _need(weights, "talker.text_projection.linear_fc2.bias"),
        "codec_embedding": _need(weights, "talker.model.codec_embedding.weight"),
    }
    return cfg, talker.eval(), predictor.eval(), tables


def _need(weights: dict[str, torch.Tensor], key: str) -> torch.Tensor:
    if key not in weights:
        raise KeyError(f"model.safetensors: missing weight {key!r}")
    return weights[key]


def _load(module: nn.Module, weights: dict[str, torch.Tensor], prefixes: dict[str, str]) -> None:
    state = {}
    for name, param in module.state_dict().items():
        src = next((p + name[len(m):] for m, p in prefixes.items() if name.startswith(m)), None)
        if src is None:
            raise KeyError(f"no checkpoint prefix maps module weight {name!r}")
        tensor = _need(weights, src)
        if tuple(tensor.shape) != tuple(param.shape):
            raise ValueError(f"model.safetensors: {src} has shape {tuple(tensor.shape)}, config implies {tuple(param.shape)}")
        state[name] = tensor
    module.load_state_dict(state, strict=True)
