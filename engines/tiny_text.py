"""A small byte-level BPE text tokenizer for tiny checkpoints, trained here (nothing may be downloaded).

Qwen2's pre-tokenizer, normalizer and decoder, with Qwen's special tokens appended after the BPE
vocabulary; written as `tokenizer.json`, `vocab.json`, `merges.txt` and `tokenizer_config.json`
(Qwen2Tokenizer), the files the reference processors load.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

# Qwen's special tokens, in Qwen's order, appended after the BPE vocabulary. The TTS names are the
# real ones (`<tts_pad>`, `<tts_text_bos>`, `<tts_text_eod>`, ids 151671..151673 in Qwen's vocab).
SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|audio_start|>", "<|audio_end|>",
    "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>", "<tts_text_bos_single>", "<|audio_pad|>",
]
QWEN2_SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
BPE_VOCAB_SIZE = 768  # 256 byte symbols + merges; the special tokens come on top


def write_text_tokenizer(out: Path, extra_specials: tuple[str, ...] = ()) -> Tokenizer:
    """Train the small byte-level BPE and write tokenizer.json, vocab.json, merges.txt and
    tokenizer_config.json (Qwen2Tokenizer). `extra_specials` come after Qwen's special tokens (a
    family's own placeholders). Returns the `tokenizers.Tokenizer`."""
    specials = [*SPECIAL_TOKENS, *extra_specials]
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_VOCAB_SIZE, min_frequency=2, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[],
    )
    tok.train_from_iterator(corpus_lines(), trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    for role in ("assistant", "user", "system", "\n"):
        # qwen-tts slices the prompt by token position (role = ids[:3], trailer = ids[-5:]).
        if len(tok.encode(role, add_special_tokens=False).ids) != 1:
            raise RuntimeError(f"the tiny tokenizer splits {role!r}; the corpus needs more of it")

    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    model = json.loads(tok.to_str())["model"]
    vocab = dict(sorted(model["vocab"].items(), key=lambda kv: kv[1]))
    write_json(out / "vocab.json", vocab)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    (out / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")
    write_json(out / "tokenizer_config.json", _tokenizer_config(tok, specials))
    return tok


def _tokenizer_config(tok: Tokenizer, specials: list[str]) -> dict:
    added = {
        str(tok.token_to_id(t)): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                  "single_word": False, "special": True}
        for t in specials
    }
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "additional_special_tokens": [t for t in specials if t != "<|endoftext|>"],
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 131072,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


def write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


# ------------------------------------------------------------------------------------- corpus

_ENGLISH = """\
Hello, world! This is a small test of the speech engine.
The quick brown fox jumps over the lazy dog.
She said she would be here by noon, but the train was late.
Please turn left at the next corner and walk for two minutes.
It's a beautiful day; the sun is shining and the birds are singing.
I can't believe it's already the end of the year.
We'll meet at the station at half past seven.
They're going to the market to buy bread, cheese, and apples.
Would you like a cup of tea or a glass of water?
The meeting has been moved to Thursday afternoon.
Your order number is ready for pickup at the front desk.
The temperature today will reach a high of twenty degrees.
Good morning! How are you feeling today?
Thank you very much for your help with the project.
The library closes at nine o'clock on weekdays.
Remember to save your work before you shut down the computer.
A journey of a thousand miles begins with a single step.
The assistant reads the message aloud to the user.
The user asks the assistant a question about the weather.
Speech synthesis turns written text into natural sounding audio.
Every sentence should sound clear, calm, and friendly.
Numbers like 3.14, 42, and 1,000,000 are read digit by digit.
Call me at 555-0123 or send an email before Friday.
The price is $19.99, plus tax, which makes about $21.50.
On March 5th, 2024, the team shipped version 2.1 of the app.
Wait... what did you just say?
Yes! No? Maybe - I honestly don't know.
The train leaves from platform 9 at 10:45 in the morning.
Open the window, please; it's getting warm in here.
He whispered: "Don't forget the keys."
The children laughed and ran across the green field.
Our flight was delayed by three hours because of the storm.
Please speak slowly and clearly so everyone can understand.
The recipe needs two eggs, a cup of flour, and some sugar.
Mountains, rivers, forests, and deserts cover the land.
Music can change the mood of a room in a single moment.
The old clock on the wall stopped at midnight.
Can you hear me now? The connection seems to be better.
Turn the volume down a little, it's too loud.
Let's try that again from the beginning.
The museum is open from Tuesday to Sunday.
Scientists study the stars, the planets, and the moon.
Take the second exit at the roundabout.
This voice is warm, gentle, and easy to listen to.
Battery level is low; please connect the charger.
The package will arrive between 2 pm and 6 pm.
Reading aloud helps with learning new words.
What time is it in Tokyo, London, and New York?
The cat sat quietly on the windowsill, watching the rain.
I'd like to book a table for four at eight o'clock.
"""

_CHINESE = """\
你好，世界！这是一个语音合成的测试。
今天天气很好，我们一起去公园散步吧。
请在下一个路口左转，然后直走两分钟。
其实我真的有发现，我是一个特别善于观察别人情绪的人。
我叫通义千问，是阿里云的开源大模型。
火车将在上午十点四十五分从九号站台出发。
谢谢你的帮助，我们明天见。
这本书非常有意思，我已经读了三遍了。
请说慢一点，让大家都能听清楚。
北京的秋天很美，天空又高又蓝。
他说：“别忘了带钥匙。”
会议改到星期四下午三点。
你吃饭了吗？我们一起去吃饭吧。
音乐可以在一瞬间改变房间的气氛。
"""

_ROLE_LINES = [
    "assistant", "user", "system", "the assistant", "the user",
    "assistant\n", "user\n", "system\n",
]


def corpus_lines() -> list[str]:
    """The embedded training corpus: English and Chinese sentences, role words, digits and symbols.

    Repetition is deliberate: it decides which merges BPE learns (the role words must end up as
    single tokens), and it is part of the deterministic recipe, so change it only on purpose.
    """
    english = _ENGLISH.splitlines()
    chinese = _CHINESE.splitlines()
    lines: list[str] = []
    lines += english * 2
    lines += chinese * 2
    lines += _ROLE_LINES * 40
    for i in range(120):  # numbers, dates, times and punctuation in varied shapes
        lines.append(f"Item {i}: {i * 37 % 1000}.{i % 10}% — {2000 + i % 30}-{1 + i % 12:02d}-{1 + i % 28:02d}, "
                     f"{i % 24:02d}:{i * 7 % 60:02d} ({english[i % len(english)][:24]}...)")
        lines.append(f"{chinese[i % len(chinese)]} 第{i}号，共{i * 3}元。")
    return lines
