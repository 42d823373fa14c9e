"""Makes the demo's shipped assets (run once by a developer; the outputs are committed):
  examples/data/train.jsonl, examples/data/validation.jsonl  -- a small learnable instruction task
  examples/tokenizer/tokenizer.json, tokenizer_config.json     -- a 512-token byte-level BPE
The product never runs Python; the demo's model is made by `qlora-make-tiny-model`, which copies
this tokenizer into the model folder.
"""
import json
import random
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

ROOT = Path(__file__).resolve().parent
NUMBERS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


def example(rng):
    kind = rng.randrange(3)
    if kind == 0:
        n = rng.randrange(100)
        words = " ".join(NUMBERS[int(d)] for d in str(n))
        return {"instruction": f"Spell the digits of {n}.", "output": words}
    if kind == 1:
        word = "".join(rng.choice("abcdefghij") for _ in range(rng.randrange(3, 7)))
        return {"instruction": f"Reverse the word {word}.", "output": word[::-1]}
    a, b = rng.randrange(10), rng.randrange(10)
    return {"instruction": f"Add {a} and {b}.", "output": str(a + b)}


def main():
    rng = random.Random(1234)
    (ROOT / "data").mkdir(exist_ok=True)
    for name, count in [("train", 2000), ("validation", 100)]:
        with open(ROOT / "data" / f"{name}.jsonl", "w") as f:
            for _ in range(count):
                f.write(json.dumps(example(rng)) + "\n")
    pattern = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
               r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    specials = ["<|begin_of_text|>", "<|end_of_text|>"]
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    texts = []
    for line in open(ROOT / "data" / "train.jsonl"):
        r = json.loads(line)
        texts.append(f"### Instruction:\n{r['instruction']}\n\n### Response:\n{r['output']}")
    tok.train_from_iterator(texts, trainer)
    (ROOT / "tokenizer").mkdir(exist_ok=True)
    tok.save(str(ROOT / "tokenizer" / "tokenizer.json"))
    config = {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>",
              "add_bos_token": True, "add_eos_token": False, "model_max_length": 2048,
              "tokenizer_class": "PreTrainedTokenizerFast"}
    with open(ROOT / "tokenizer" / "tokenizer_config.json", "w") as f:
        json.dump(config, f, indent=2)
    print("vocab", tok.get_vocab_size())


if __name__ == "__main__":
    main()
