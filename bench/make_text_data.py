"""Writes a text dataset of random words, one document per line. By default every line is longer
than the benchmark's sequence (3000 words, about 9,400 tokens with examples/tokenizer: each
example fills a 2048-token row after truncation); with --min-words the lengths are uniform in
[min-words, words], for packed rows that hold several documents (about 3.1 tokens per word).
  python3 bench/make_text_data.py OUT.txt [--lines 400] [--words 3000] [--min-words N]
"""
import argparse
import random

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--lines", type=int, default=400)
p.add_argument("--words", type=int, default=3000)
p.add_argument("--min-words", type=int, help="shortest line (default: every line has --words)")
args = p.parse_args()
rng = random.Random(0)
vocab = ["the", "model", "train", "data", "seven", "reverse", "add", "word", "digits", "spell", "of", "and",
         "response", "instruction", "four", "nine", "two", "eight", "zero", "one"]
with open(args.out, "w") as f:
    for _ in range(args.lines):
        words = args.words if args.min_words is None else rng.randint(args.min_words, args.words)
        f.write(" ".join(rng.choice(vocab) + rng.choice(["", "s", "ed", ",", "."]) for _ in range(words)) + "\n")
