"""The demo's tiny model fits the tokenizer it ships with: the model scripts/demo.sh makes
(qlora-make-tiny-model with examples/tiny-model.flags) has the example tokenizer's vocabulary
size and its BOS and EOS ids, so that generation from a trained demo model stops at the
tokenizer's end-of-text token.

  python3 tests/demo/check_demo_model.py BUILD_DIR SOURCE_DIR
"""
import json
import os
import subprocess
import sys
import tempfile


def token_id(tokenizer, content):
    for token in tokenizer.get("added_tokens", []):
        if token["content"] == content:
            return token["id"]
    return tokenizer["model"]["vocab"][content]


def main(build, source):
    with open(os.path.join(source, "scripts", "demo.sh")) as f:
        assert "examples/tiny-model.flags" in f.read(), "scripts/demo.sh no longer uses examples/tiny-model.flags"
    with tempfile.TemporaryDirectory() as d:
        model = os.path.join(d, "tiny")
        subprocess.run([os.path.join(build, "worker", "engine", "qlora-make-tiny-model"), model,
                        "--flagfile=" + os.path.join(source, "examples", "tiny-model.flags")],
                       check=True, capture_output=True)
        with open(os.path.join(model, "config.json")) as f:
            config = json.load(f)
    tokenizer_dir = os.path.join(source, "examples", "tokenizer")
    with open(os.path.join(tokenizer_dir, "tokenizer.json")) as f:
        tokenizer = json.load(f)
    with open(os.path.join(tokenizer_dir, "tokenizer_config.json")) as f:
        tokenizer_config = json.load(f)
    size = len(tokenizer["model"]["vocab"]) + sum(
        t["content"] not in tokenizer["model"]["vocab"] for t in tokenizer.get("added_tokens", []))
    problems = []
    if config["vocab_size"] != size:
        problems.append(f"vocab_size {config['vocab_size']}, the tokenizer has {size} tokens")
    for key in ("bos", "eos"):
        want = token_id(tokenizer, tokenizer_config[f"{key}_token"])
        if config[f"{key}_token_id"] != want:
            problems.append(f"{key}_token_id {config[f'{key}_token_id']}, the tokenizer's "
                            f"{tokenizer_config[key + '_token']} is {want}")
    if problems:
        print("the demo model does not fit its tokenizer: " + "; ".join(problems))
        return 1
    print("demo model: vocabulary, BOS and EOS match the example tokenizer")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
