#!/usr/bin/env python3
"""Writes the synthetic seed inputs of the fuzz targets into tests/fuzz/corpus/<target>/seed-*.

Standard library only (the protobuf requests are encoded by hand). Copies of real project files
(example and test job files, the example tokenizer) are made here too, so that one command
rebuilds every seed; inputs named crash-* are regression inputs for fixed bugs, kept by hand.

    tests/fuzz/make_seeds.py
"""
import json
import os
import shutil
import struct

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CORPUS = os.path.join(ROOT, "tests", "fuzz", "corpus")


def write(target, name, data):
    folder = os.path.join(CORPUS, target)
    os.makedirs(folder, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(folder, "seed-" + name), "wb") as f:
        f.write(data)


# --- job files: the example, every good test file and a few bad ones --------------------------
def job_files():
    write("job_config_fuzzer", "qlora-tiny.yaml", open(os.path.join(ROOT, "examples", "qlora-tiny.yaml"), "rb").read())
    jobs = os.path.join(ROOT, "tests", "assets", "jobs")
    for name in sorted(os.listdir(os.path.join(jobs, "good"))):
        write("job_config_fuzzer", "good-" + name, open(os.path.join(jobs, "good", name), "rb").read())
    for name in ("duplicate_key.yaml", "merge_key.yaml", "two_documents.yaml", "stage_word.yaml",
                 "unknown_trainer_key.yaml", "betas_three.yaml"):
        write("job_config_fuzzer", "bad-" + name, open(os.path.join(jobs, "bad", name), "rb").read())


# --- safetensors files ----------------------------------------------------------------------
def safetensors(header, data):
    text = json.dumps(header, separators=(",", ":")).encode()
    return struct.pack("<Q", len(text)) + text + data


def safetensors_files():
    t = "safetensors_header_fuzzer"
    write(t, "f32-2x2.safetensors",
          safetensors({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}},
                      struct.pack("<4f", 1, 2, 3, 4)))
    write(t, "metadata-two-tensors.safetensors",
          safetensors({"__metadata__": {"format": "pt"},
                       "a": {"dtype": "BF16", "shape": [3], "data_offsets": [0, 6]},
                       "b": {"dtype": "I64", "shape": [1, 1], "data_offsets": [6, 14]}},
                      bytes(range(14))))
    write(t, "empty-and-scalar.safetensors",
          safetensors({"e": {"dtype": "U8", "shape": [0, 5], "data_offsets": [0, 0]},
                       "s": {"dtype": "F64", "shape": [], "data_offsets": [0, 8]}},
                      struct.pack("<d", 0.5)))
    # Header padded with trailing spaces, as the Python writer aligns it.
    text = b'{"x":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}    '
    write(t, "padded.safetensors", struct.pack("<Q", len(text)) + text + b"abcd")


# --- dataset files: first byte = format | skip<<2 | (shards-1)<<3 | small-limit<<6 -----------
def control(fmt, skip=True, shards=1, small=False):
    return bytes([{"jsonl": 0, "csv": 1, "text": 2}[fmt] | (4 if skip else 0) | ((shards - 1) << 3) | (0x40 if small else 0)])


def dataset_files():
    t = "record_reader_fuzzer"
    lines = open(os.path.join(ROOT, "examples", "data", "validation.jsonl"), "rb").read().splitlines(True)[:6]
    write(t, "jsonl-example-4-shards", control("jsonl", shards=4) + b"".join(lines))
    write(t, "jsonl-malformed-fail", control("jsonl", skip=False) +
          b'{"instruction": "a", "output": "b"}\n[1, 2]\n{"x": \n\n{"n": 1, "t": true, "z": null}\n')
    write(t, "jsonl-malformed-skip-small", control("jsonl", shards=3, small=True) +
          b'{"a": "' + b"x" * 100 + b'"}\r\n{"a": "y"}\nnot json\n{"a": {"nested": [1]}}\n')
    write(t, "csv-quoted-4-shards", control("csv", shards=4) +
          b'instruction,output\r\n"say ""hi""",hi\r\n"two\nlines",x\r\nplain,"a,b"\r\n\r\nlast,"q"\r\n')
    write(t, "csv-bad-fields-fail", control("csv", skip=False, shards=2) +
          b'a,b,c\n1,2,3\n1,2\n"open,4,5\n')
    write(t, "csv-skip-small", control("csv", shards=8, small=True) +
          b'text\n' + b'"' + b"z" * 80 + b'"\nshort\n"x"y\n')
    write(t, "text-3-shards", control("text", shards=3) +
          b"one document\n\n  \nanother document\r\nthird, \"quoted\"\nlast without newline")
    write(t, "text-small", control("text", small=True) + b"a" * 100 + b"\nb\n")


# --- tokenizers -------------------------------------------------------------------------------
def byte_level_alphabet():
    """GPT-2's byte -> printable character map."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, n = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + n)
            n += 1
    return chars


def small_tokenizer(merges_as_strings, pre_tokenizer, post_processor):
    alphabet = byte_level_alphabet()
    vocab = {alphabet[b]: b for b in range(256)}
    merges = [("h", "e"), ("l", "l"), ("he", "ll"), (alphabet[32], "w")]
    for left, right in merges:
        vocab[left + right] = len(vocab)
    return json.dumps({
        "version": "1.0",
        "added_tokens": [
            {"id": len(vocab), "content": "<|begin_of_text|>", "special": True, "lstrip": False,
             "rstrip": False, "single_word": False, "normalized": False},
            {"id": len(vocab) + 1, "content": "<|eot_id|>", "special": True, "lstrip": True,
             "rstrip": True, "single_word": False, "normalized": False},
            {"id": len(vocab) + 2, "content": "word", "special": False, "lstrip": False,
             "rstrip": False, "single_word": True, "normalized": True},
        ],
        "normalizer": None,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": post_processor,
        "decoder": {"type": "ByteLevel"},
        "model": {"type": "BPE", "vocab": vocab, "ignore_merges": not merges_as_strings,
                  "merges": [f"{a} {b}" if merges_as_strings else [a, b] for a, b in merges]},
    }, ensure_ascii=False, indent=1)


def tokenizer_files():
    t = "tokenizer_json_fuzzer"
    write(t, "example-tokenizer.json", open(os.path.join(ROOT, "examples", "tokenizer", "tokenizer.json"), "rb").read())
    write(t, "bytelevel-string-merges.json", small_tokenizer(
        True, {"type": "ByteLevel", "add_prefix_space": True, "use_regex": True},
        {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<|begin_of_text|>"}},
                                                  {"Sequence": {"id": "A"}}],
         "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [260]}}}))
    write(t, "split-sequence-pair-merges.json", small_tokenizer(
        False, {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": "\\s+|\\p{N}{1,3}"}, "behavior": "Removed", "invert": False},
            {"type": "Split", "pattern": {"String": "."}, "behavior": "Isolated"},
            {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}]},
        {"type": "Sequence", "processors": [{"type": "TemplateProcessing", "single": [
            {"Sequence": {"id": "A"}}, {"SpecialToken": {"id": "<|eot_id|>"}}],
            "special_tokens": {"<|eot_id|>": {"id": "<|eot_id|>", "ids": [261]}}}]}))

    t = "tokenizer_encode_fuzzer"
    texts = [
        "Hello, world! It's 2024.",
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
        "  leading and trailing spaces   \n\n\ttabs\r\n",
        "ünïcödé 日本語 🙂 and digits 1234567",
        "### Instruction:\nAdd 1 and 1.\n\n### Response:\n2",
    ]
    for i, text in enumerate(texts):
        write(t, f"bpe-{i}", b"\x00" + text.encode())
        write(t, f"spm-{i}", b"\x01" + text.encode())
    write(t, "bpe-invalid-utf8", b"\x00abc \xff\xfe \xc3 \xe2\x82 end")


# --- RPC calls: [selector][length u16 LE][serialized request] ---------------------------------
def varint(n):
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def field(number, value):
    if isinstance(value, bool) or isinstance(value, int):
        return varint(number << 3) + varint(int(value))
    if isinstance(value, float):
        return varint(number << 3 | 1) + struct.pack("<d", value)
    if isinstance(value, str):
        value = value.encode()
    return varint(number << 3 | 2) + varint(len(value)) + value


def message(*fields):
    return b"".join(field(n, v) for n, v in fields)


# The selector (first byte) modulo 12 picks the RPC (rpc_handlers_fuzzer.cc: Dispatch).
(SUBMIT, VALIDATE, GET, LIST, CANCEL, REGISTER, NCCL, HEARTBEAT, PROGRESS, COMPLETION, STORE,
 STORE_GET) = range(12)


def call(selector, body):
    return bytes([selector]) + struct.pack("<H", len(body)) + body


JOB = """base_model: model
dataset: {dataset}
adapter: {{type: lora}}
backend: {{type: local, trainer: {{num_workers: {workers}}}}}
trainer: {{batch_size: 1, epochs: 1}}
"""


GENERATION = 1700000000 * 1000000  # rpc_fuzz_env.h: kFuzzGeneration


def rpc_files():
    t = "rpc_handlers_fuzzer"
    one = JOB.format(dataset="train.jsonl", workers=1)
    two = JOB.format(dataset="train.csv", workers=2)
    progress = message((1, 0), (2, 3), (3, 10), (4, 1), (5, 1.5), (6, 2e-4), (7, 100.0), (8, float("nan")))
    write(t, "one-worker-life", b"".join([
        call(SUBMIT, message((1, one), (4, "fuzz-job"))),
        call(GET, message((1, "job-000001"))),
        call(LIST, message((1, 1), (1, 2), (2, 10), (4, True))),
        call(REGISTER, message((1, "job-000001"), (2, "@0"), (3, 0), (4, 1000))),
        call(HEARTBEAT, message((1, "job-000001"), (2, "@0"), (3, 0))),
        call(PROGRESS, message((1, "job-000001"), (2, "@0"), (3, progress))),
        call(COMPLETION, message((1, "job-000001"), (2, "@0"), (3, 0), (4, True), (6, "adapter"))),
        call(GET, message((1, "job-000001"))),
    ]))
    write(t, "two-workers-store", b"".join([
        call(SUBMIT, message((1, two), (5, "two.yaml"))),
        call(REGISTER, message((1, "job-000001"), (2, "@0"), (3, 0), (4, 1000))),
        call(REGISTER, message((1, "job-000001"), (2, "@1"), (3, 1), (4, 1001))),
        call(NCCL, message((1, "job-000001"), (2, "@0"), (3, b"\x01" * 128))),
        call(STORE, message((1, "job-000001"), (2, "@0"), (3, GENERATION), (4, "key"), (5, b"v"))),
        call(STORE_GET, message((1, "job-000001"), (2, "@1"), (3, GENERATION), (4, "key"), (5, 1))),
        call(COMPLETION, message((1, "job-000001"), (2, "@1"), (3, 1), (4, False), (5, "boom"))),
        call(CANCEL, message((1, "job-000001"))),
    ]))
    write(t, "validate-and-list-pages", b"".join([
        call(VALIDATE, message((1, JOB.format(dataset="train.txt", workers=1)), (2, "train.txt"))),
        call(VALIDATE, message((1, "trainer: {batch_size: 0}\n"))),
        call(SUBMIT, message((1, one), (3, "train.jsonl"), (6, "/nonexistent"))),
        call(SUBMIT, message((1, one))),
        call(SUBMIT, message((1, two))),
        call(LIST, message((2, 1))),
        call(LIST, message((2, 1), (3, "job-000001"))),
        call(CANCEL, message((1, "job-000002"))),
    ]))


# --- HTTP request heads: what browsers, curl and Prometheus send, and a few refusals ------------
def http_requests():
    t = "http_request_fuzzer"
    write(t, "curl", "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:9464\r\nUser-Agent: curl/7.88.1\r\nAccept: */*\r\n\r\n")
    write(t, "browser", "GET /jobs/job-000001?after=3&rank=0 HTTP/1.1\r\nHost: localhost:9464\r\n"
          "Authorization: Bearer abc\r\nAccept: text/html\r\nAccept-Encoding: gzip, deflate\r\n"
          "Connection: keep-alive\r\n\r\n")
    write(t, "head-lf", "HEAD /api/jobs HTTP/1.0\n\n")
    write(t, "percent", "GET /static/status%2Ejs HTTP/1.1\r\nHost: [::1]:9464\r\n\r\n")
    write(t, "post-body", "POST /api/jobs HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}")
    write(t, "folded", "GET / HTTP/1.1\r\nHost: a\r\n b\r\n\r\n")


if __name__ == "__main__":
    job_files()
    safetensors_files()
    dataset_files()
    tokenizer_files()
    rpc_files()
    http_requests()
