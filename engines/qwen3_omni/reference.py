"""transformers' own Qwen3-Omni talker generation, run the way the tests compare with it.

`generate` builds the talker's input from a conversation with the library's own helpers
(`_get_talker_user_parts`, `_get_talker_assistant_parts`, as `Qwen3OmniMoeForConditionalGeneration.
generate` does after its thinker has run): the thinker's sequence is the tokenized conversation, its
input embeddings are `embed_tokens` of that sequence without its last token (exactly what the thinker
reports for text), and no thinker forward is needed. Media placeholders in user turns take the given
thinker hidden states (one row per placeholder, in order), as the thinker's `hidden_states` at
`accept_hidden_layer` would hold them. The chat turns are walked by the library's loop, copied
branch for branch (it sits inside `generate`, after the thinker, so it cannot be called alone): system
turns and earlier assistant turns are skipped. Then `talker.generate` runs greedily (the code
predictor's hard-coded sampling switched off) and `code2wav` decodes its codes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch


def generate(model, tokenizer: Path, text: str, turns: tuple[str | tuple[str, str], ...] = (),
             speaker: str = "ethan", max_new_tokens: int = 64, repetition_penalty: float = 1.0,
             media: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Greedy codes [N, G] (N frames: the token that ends generation gets no residuals) and the
    library's PCM for them (1920 x N - 555 samples). `turns` is the conversation before the reply: a
    string is a user turn, a pair is (role, content) with role system, user or assistant."""
    from tokenizers import Tokenizer

    cfg = model.config
    tc = cfg.talker_config
    pairs = [("user", t) if isinstance(t, str) else t for t in turns]
    conversation = "".join(f"<|im_start|>{role}\n{content}<|im_end|>\n" for role, content in pairs)
    prompt = Tokenizer.from_file(str(tokenizer)).encode(conversation + "<|im_start|>assistant\n").ids
    sequence = Tokenizer.from_file(str(tokenizer)).encode(f"{conversation}<|im_start|>assistant\n{text}<|im_end|>").ids
    input_ids, sequences = torch.tensor([prompt]), torch.tensor([sequence])
    with torch.no_grad():
        embed = model.thinker.get_input_embeddings()
        thinker_embed = embed(sequences[:, :-1])
        special = torch.tensor([[cfg.tts_bos_token_id, cfg.tts_eos_token_id, cfg.tts_pad_token_id]])
        tts_bos, tts_eos, tts_pad = model.talker.text_projection(embed(special)).chunk(3, dim=1)
        media_mask, thinker_hidden = placeholders(model, sequences, media)
        starts = [*torch.nonzero(input_ids[0] == cfg.im_start_token_id).squeeze(-1).tolist(), sequences.shape[-1]]
        rows, ids, trailing = [], [], None
        for i in range(len(starts) - 1):  # the library's loop over chat turns, branch for branch
            s, e = starts[i], starts[i + 1]
            role = int(input_ids[0, s + 1])
            if role == cfg.system_token_id:
                continue
            elif role == cfg.user_token_id:
                rows.append(model._get_talker_user_parts(s, e, media_mask, thinker_hidden, thinker_embed))
                ids.append(sequences[:, s:e])
            elif role == cfg.assistant_token_id and i == len(starts) - 2:
                part, part_ids, trailing = model._get_talker_assistant_parts(
                    s, e, tc.speaker_id[speaker], thinker_embed, tts_pad, tts_bos, tts_eos)
                rows.append(part)
                ids.append(part_ids)
            elif role == cfg.assistant_token_id:
                continue  # an earlier assistant turn
            else:
                raise AssertionError(f"role token {role} after <|im_start|>")
        predictor = model.talker.code_predictor
        sampled = predictor.generate
        predictor.generate = lambda *a, **k: sampled(*a, **{**k, "do_sample": False, "top_k": None, "top_p": None})
        try:
            vocab = tc.text_config.vocab_size
            out = model.talker.generate(
                inputs_embeds=torch.cat(rows, 1), trailing_text_hidden=trailing, tts_pad_embed=tts_pad,
                talker_input_ids=torch.cat(ids, 1), max_new_tokens=max_new_tokens, do_sample=False,
                repetition_penalty=repetition_penalty, eos_token_id=tc.codec_eos_token_id,
                suppress_tokens=[i for i in range(vocab - 1024, vocab) if i != tc.codec_eos_token_id],
                output_hidden_states=True, return_dict_in_generate=True)
        finally:
            predictor.generate = sampled
        codes = torch.stack([h[-1] for h in out.hidden_states if h[-1] is not None], 1).transpose(1, 2)  # [1, G, N]
        pcm = model.code2wav(codes)[0, 0] if codes.shape[-1] else torch.zeros(0)
    return codes[0].T.numpy(), pcm.numpy()


def placeholders(model, sequences: torch.Tensor, media: np.ndarray | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The library's `multimodal_mask` over `sequences` [1, S], and thinker hidden states [1, S - 1, W]
    holding `media` at the placeholders (zeros elsewhere: they are read only there)."""
    cfg = model.config.thinker_config
    ids = torch.tensor([cfg.audio_token_id, cfg.image_token_id, cfg.video_token_id])
    mask = torch.isin(sequences, ids)
    hidden = torch.zeros((1, sequences.shape[1] - 1, cfg.text_config.hidden_size))
    if media is not None:
        hidden[mask[:, :-1]] = torch.from_numpy(np.asarray(media, np.float32))
    return mask, hidden


def user_rows(model, tokenizer: Path, user_turns: tuple[str, ...], media: np.ndarray | None) -> np.ndarray:
    """The talker rows of the user turns, [rows, hidden], as the library's `_get_talker_user_parts`
    builds them."""
    from tokenizers import Tokenizer

    cfg = model.config
    conversation = "".join(f"<|im_start|>user\n{u}<|im_end|>\n" for u in user_turns)
    ids = Tokenizer.from_file(str(tokenizer)).encode(conversation + "<|im_start|>assistant\n").ids
    sequences = torch.tensor([ids])
    with torch.no_grad():
        thinker_embed = model.thinker.get_input_embeddings()(sequences[:, :-1])
        mask, hidden = placeholders(model, sequences, media)
        starts = [*torch.nonzero(sequences[0] == cfg.im_start_token_id).squeeze(-1).tolist()]
        parts = [model._get_talker_user_parts(s, e, mask, hidden, thinker_embed) for s, e in zip(starts, starts[1:])]
    return torch.cat(parts, 1)[0].numpy()
