"""Builds small tokenizers with the reference Python libraries and writes the ids they give.

Usage: make_tokenizers.py OUT_DIR
Writes OUT_DIR/<name>/ (tokenizer.json or tokenizer.model, tokenizer_config.json) for:
  bpe_llama3   byte-level BPE, Llama-3 pre-tokenizer (Split regex + ByteLevel), ignore_merges,
               TemplateProcessing BOS, merges as pairs
  bpe_llama3_legacy_merges   the same tokenizer with merges written as "a b" strings
  bpe_gpt2     byte-level BPE with ByteLevel(use_regex=True), no ignore_merges, lstrip token
  bpe_qwen2    byte-level BPE with Qwen2's NFC normalizer and its pre-tokenizer (single digits)
  spm_bpe      SentencePiece BPE with byte fallback (Llama-2 style)
  spm_unigram  SentencePiece unigram with byte fallback
and OUT_DIR/expected.json: {name: {texts, ids, full, decoded, bos_id, eos_id}} where ids are
encode(text) without special tokens and full adds them as transformers does.
"""
import json
import os
import sys

import sentencepiece as spm
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from tokenizers import trainers
from tokenizers import AddedToken

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                 r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
            "<|eot_id|>"]

STRESS = [
    "Hello, world! This is a test.",
    "  leading spaces and trailing   ",
    "tabs\tand\t\ttabs\nnew\nlines\r\nCRLF\r\n\r\n\n\n",
    "I'm sure they'll've DON'T WE'LL it's O'Neil's 's 'S",
    "numbers 1234567890 3.14159 -42 1,000,000 0x1F 2024-11-29 12:30",
    "def f(x):\n    return {'a': [1, 2, 3], \"b\": x ** 2}  # comment\n\tpass",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }   // C++",
    "日本語のテキストです。漢字とかなカナ。",
    "中文文本，包括标点符号！",
    "한국어 텍스트입니다.",
    "Русский текст с пунктуацией — и тире.",
    "Ελληνικά γράμματα αβγ ΑΒΓ",
    "العربية نص من اليمين إلى اليسار",
    "עברית טקסט",
    "हिन्दी पाठ देवनागरी में",
    "ภาษาไทยไม่มีช่องว่าง",
    "emoji 🙂😀🎉 family 👨‍👩‍👧‍👦 flags 🇺🇸🇯🇵 skin 👍🏽 keycap 1️⃣",
    "combining é vs é, Å, ñ, a\u0301\u0302",
    "whitespace\u00a0nbsp\u3000ideographic\u2028line\u2029para\u0085nel\u2009thin end",
    "zero\u200bwidth\u200cjoiner\u200d\ufeffbom",
    "math ∑∫√∞ ≤ ≥ ≠ ± × ÷ → ⇒ ∀x∃y",
    "<|begin_of_text|>Hello<|eot_id|>",
    "x<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|> tail",
    "partial <|begin_of special <|end_of_text|><|end_of_text|>",
    "   <|eot_id|>   spaced special   ",
    "fill  <mask> here<mask> and <mask>x",
    "URL https://example.com/path?q=1&r=%20#frag and e-mail a.b@c.de",
    "MiXeD CaSe WoRdS and ALLCAPS and lowercase",
    "!!!??? ... --- *** ### @@@ $$$ %%% ^^^ &&& ((( ))) [[[ ]]]",
    "\x01\x02control\x7f chars\x1b[0m",
    "a" * 300,
    " " * 50 + "x" + "\n" * 20,
    "",
    " ",
    "\n",
    "The quick brown fox jumps over the lazy dog. " * 5,
]

TRAIN_EXTRA = [
    "The quick brown fox jumps over the lazy dog.",
    "Instruction: summarize the following text. Response: the text is short.",
    "import numpy as np\nx = np.arange(10)\nprint(x.sum())\n",
    "In 2024, 37% of 1,250 users said they're happy; we'll see.",
]


def corpus_lines():
    lines = []
    for i in range(40):
        lines.extend(STRESS)
        lines.extend(t.replace("the", f"the{i}") for t in TRAIN_EXTRA)
    return [l for l in lines if l]


def train_bpe(use_llama3, vocab_size=800, pattern=LLAMA3_PATTERN, nfc=False):
    tok = Tokenizer(models.BPE(ignore_merges=use_llama3))
    if nfc:
        tok.normalizer = normalizers.NFC()
    if use_llama3:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
        ])
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus_lines(), trainer=trainer)
    if use_llama3:
        bos = "<|begin_of_text|>"
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
                                          special_tokens=[(bos, tok.token_to_id(bos))]),
        ])
    else:
        tok.add_tokens([AddedToken(" <mask>", lstrip=True, rstrip=False, normalized=False)])
    return tok


def write_hf(tok, directory, config, legacy_merges=False):
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "tokenizer.json")
    tok.save(path)
    if legacy_merges:
        data = json.load(open(path, encoding="utf-8"))
        data["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m
                                   for m in data["model"]["merges"]]
        json.dump(data, open(path, "w", encoding="utf-8"), ensure_ascii=False)
    json.dump(config, open(os.path.join(directory, "tokenizer_config.json"), "w"))


LLAMA3_CHAT_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}")

CHATS = [
    [{"role": "user", "content": "Hello there!"},
     {"role": "assistant", "content": " Hi! How can I help?  "}],
    [{"role": "system", "content": "You are terse.\n"},
     {"role": "user", "content": "Translate: 日本語のテキスト 🙂"},
     {"role": "assistant", "content": "Japanese text 🙂"},
     {"role": "user", "content": "def f(x):\n    return x ** 2"},
     {"role": "assistant", "content": "It squares x.\n\n  Done."}],
]


def expected_chat(directory):
    from transformers import PreTrainedTokenizerFast
    fast = PreTrainedTokenizerFast(tokenizer_file=os.path.join(directory, "tokenizer.json"),
                                   bos_token="<|begin_of_text|>", eos_token="<|end_of_text|>")
    fast.chat_template = LLAMA3_CHAT_TEMPLATE
    out = []
    for chat in CHATS:
        ids = fast.apply_chat_template(chat, tokenize=True, add_generation_prompt=False)
        if hasattr(ids, "keys"):
            ids = ids["input_ids"]
        out.append({"messages": json.dumps(chat, ensure_ascii=False), "ids": list(ids)})
    return out


def expected_hf(directory):
    from transformers import PreTrainedTokenizerFast
    tok = Tokenizer.from_file(os.path.join(directory, "tokenizer.json"))
    cfg = json.load(open(os.path.join(directory, "tokenizer_config.json")))
    fast = PreTrainedTokenizerFast(tokenizer_file=os.path.join(directory, "tokenizer.json"),
                                   bos_token=cfg.get("bos_token"), eos_token=cfg.get("eos_token"))
    ids = [tok.encode(t, add_special_tokens=False).ids for t in STRESS]
    return {
        "texts": STRESS,
        "ids": ids,
        "transformers_ids": [fast.encode(t, add_special_tokens=False) for t in STRESS],
        "full": [fast.encode(t, add_special_tokens=True) for t in STRESS],
        "decoded": [tok.decode(i, skip_special_tokens=False) for i in ids],
        "bos_id": fast.bos_token_id if fast.bos_token_id is not None else -1,
        "eos_id": fast.eos_token_id if fast.eos_token_id is not None else -1,
    }


def train_spm(directory, model_type):
    os.makedirs(directory, exist_ok=True)
    corpus = os.path.join(directory, "corpus.txt")
    with open(corpus, "w", encoding="utf-8") as f:
        for line in corpus_lines():
            f.write(line.replace("\n", " ").replace("\r", " ") + "\n")
    spm.SentencePieceTrainer.train(
        input=corpus, model_prefix=os.path.join(directory, "tokenizer"), vocab_size=600,
        model_type=model_type, byte_fallback=True, character_coverage=0.9995,
        split_digits=True, allow_whitespace_only_pieces=True, remove_extra_whitespaces=False,
        normalization_rule_name="identity", unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
        hard_vocab_limit=False, minloglevel=2)
    os.remove(corpus)
    json.dump({"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True,
               "add_eos_token": False, "legacy": False, "pad_token": None},
              open(os.path.join(directory, "tokenizer_config.json"), "w"))
    sp = spm.SentencePieceProcessor(model_file=os.path.join(directory, "tokenizer.model"))
    ids = [sp.encode(t) for t in STRESS]
    return {"texts": STRESS, "ids": ids, "transformers_ids": ids,
            "full": [[sp.bos_id()] + i for i in ids], "decoded": [sp.decode(i) for i in ids],
            "bos_id": sp.bos_id(), "eos_id": sp.eos_id()}


def main():
    out = sys.argv[1]
    expected = {}
    llama3 = train_bpe(True)
    config = {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"}
    write_hf(llama3, os.path.join(out, "bpe_llama3"), config)
    write_hf(llama3, os.path.join(out, "bpe_llama3_legacy_merges"), config, legacy_merges=True)
    gpt2 = train_bpe(False)
    write_hf(gpt2, os.path.join(out, "bpe_gpt2"), {"eos_token": "<|end_of_text|>"})
    qwen2 = train_bpe(True, pattern=QWEN2_PATTERN, nfc=True)
    write_hf(qwen2, os.path.join(out, "bpe_qwen2"), config)
    for name in ["bpe_llama3", "bpe_llama3_legacy_merges", "bpe_gpt2", "bpe_qwen2"]:
        expected[name] = expected_hf(os.path.join(out, name))
    expected["chat_llama3"] = expected_chat(os.path.join(out, "bpe_llama3"))
    expected["spm_bpe"] = train_spm(os.path.join(out, "spm_bpe"), "bpe")
    expected["spm_unigram"] = train_spm(os.path.join(out, "spm_unigram"), "unigram")
    json.dump(expected, open(os.path.join(out, "expected.json"), "w", encoding="utf-8"))


if __name__ == "__main__":
    main()
