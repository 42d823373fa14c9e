"""Writes a text dataset of random words, one document per line. By default every line is longer
than the benchmark's sequence (3000 words, about 9,400 tokens with examples/tokenizer: each
example fills a 2048-token row after truncation); with --min-words the lengths are uniform in
[min-words, words], for packed rows that hold several documents (about 3.1 tokens per word).
  python3 bench/make_text_data.py OUT.txt [--lines 400] [--words 3000] [--min-words N]
With --pairs P,C it writes preference pairs instead, one JSON object per line (TRL's prompt,
chosen and rejected): a prompt of P words and two completions of C words each.
"""
import json
import argparse
import random

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--lines", type=int, default=400)
p.add_argument("--words", type=int, default=3000)
p.add_argument("--min-words", type=int, help="shortest line (default: every line has --words)")
p.add_argument("--pairs", help="PROMPT_WORDS,COMPLETION_WORDS: preference pairs as JSON Lines")
args = p.parse_args()
rng = random.Random(0)
vocab = ["the", "model", "train", "data", "seven", "reverse", "add", "word", "digits", "spell", "of", "and",
         "response", "instruction", "four", "nine", "two", "eight", "zero", "one"]


def words(n):
    return " ".join(rng.choice(vocab) + rng.choice(["", "s", "ed", ",", "."]) for _ in range(n))


with open(args.out, "w") as f:
    for _ in range(args.lines):
        if args.pairs:
            prompt, completion = (int(n) for n in args.pairs.split(","))
            f.write(json.dumps({"prompt": words(prompt), "chosen": " " + words(completion),
                                "rejected": " " + words(completion)}) + "\n")
            continue
        n = args.words if args.min_words is None else rng.randint(args.min_words, args.words)
        f.write(words(n) + "\n")
