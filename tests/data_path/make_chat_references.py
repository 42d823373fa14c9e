"""Reference results for chat templates, from transformers and jinja2.

Usage: make_chat_references.py FIXTURES_JSON OUT_DIR
For each template family in FIXTURES_JSON (tests/assets/chat_templates.json) writes
OUT_DIR/<family>/ (tokenizer.json: a byte-level BPE trained here with every family's special
tokens added; tokenizer_config.json: the family's bos/eos tokens and chat_template), and
OUT_DIR/expected.json:
  {"families": {family: [case, ...]}, "micro": [micro case, ...]}
where a case is {messages, text, text_generation, ids, mask} from transformers'
PreTrainedTokenizerFast.apply_chat_template on that folder (or {messages, error} when the
template raises), and `mask` is computed here independently of the C++ span logic: each
assistant turn's expected text (the family's rule below, after the family's assistant prefix)
is located in the rendering, and a token
is masked in when its character offsets (return_offsets_mapping) overlap such a span.
A preference case is {record, chosen, rejected, prompt_len}: a conversational pair (an explicit
prompt, or TRL's implicit one) tokenized by TRL's own helpers as its DPOTrainer tokenizes it.
A micro case is {template, variables, output | error} rendered by transformers' own Jinja
environment (trim_blocks, lstrip_blocks, its tojson and raise_exception).
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_tokenizers import train_bpe  # noqa: E402

from tokenizers import AddedToken  # noqa: E402
from transformers import PreTrainedTokenizerFast  # noqa: E402
from transformers.utils.chat_template_utils import _compile_jinja_template  # noqa: E402

EXTRA_SPECIALS = ["<s>", "</s>", "[INST]", "[/INST]", "<|im_start|>", "<|im_end|>", "<|endoftext|>"]

# What each family prints before an assistant turn, and for the turn from its content through
# its end-of-turn marker (trailing whitespace after the marker is not trained on).
TURN = {
    "llama3": ("assistant<|end_header_id|>\n\n", lambda c: c.strip() + "<|eot_id|>"),
    "llama2": ("[/INST] ", lambda c: c.strip() + " </s>"),
    "mistral_v01": ("[/INST] ", lambda c: c + "</s>"),
    "mistral_v03": ("[/INST] ", lambda c: c.strip() + "</s>"),
    "qwen2": ("<|im_start|>assistant\n", lambda c: c + "<|im_end|>"),
    "qwen25": ("<|im_start|>assistant\n", lambda c: c + "<|im_end|>"),
}


U, A, S = "user", "assistant", "system"


def chat(*turns):
    return [{"role": r, "content": c} for r, c in turns]


CONVERSATIONS = [
    chat((U, "Hello there!"), (A, " Hi! How can I help?  ")),
    chat((S, "You are terse.\n"), (U, "What is 2+2?"), (A, "4")),
    chat((S, "Answer in kind."), (U, "Translate: 日本語のテキスト 🙂"), (A, "Japanese text 🙂"),
         (U, "def f(x):\n    return x ** 2"), (A, "It squares x.\n\n  Done.")),
    chat((U, "first"), (A, "one\u00a0"), (U, "second\t"), (A, "\u3000two words")),
    chat((U, "only a question"), (A, "an answer"), (U, "a trailing question with no answer")),
    chat((U, "an empty reply follows"), (A, "")),
    # Not alternating: LLaMA-2 and Mistral raise, the others render it.
    chat((U, "one"), (U, "two"), (A, "three")),
]

# Interpreter details checked against jinja2 itself.
MICRO = [
    ("{% for x in xs %}{{ loop.index0 }}{{ loop.index }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.revindex }}|{% endfor %}", {"xs": ["a", "b", "c"]}),
    ("{% for x in xs if x != 'b' %}{{ x }}{{ loop.index }}{% else %}empty{% endfor %}", {"xs": ["a", "b", "c"]}),
    ("{% for x in xs %}{% else %}empty{% endfor %}", {"xs": []}),
    ("{% set x = 1 %}{% for i in [1, 2] %}{% set x = x + i %}{{ x }}{% endfor %}{{ x }}", {}),
    ("{% set ns = namespace(n=0) %}{% for i in range(4) %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}", {}),
    ("{%- if a %}\n  A\n{%- elif b -%}\n  B  \n{%- else %}\n  C\n{% endif %}\nend\n", {"a": False, "b": True}),
    ("  {% if true %}\n    yes\n  {% endif %}\n  {{ 'x' }}  {# comment #}\n{%+ if true %}kept{% endif %}\n", {}),
    ("{{ '  \\t x \\n '|trim }}|{{ ' y '.strip() }}|{{ 'xxhixx'.strip('x') }}|{{ ' a '.lstrip() }}|{{ ' a '.rstrip() }}|", {}),
    ("{{ 'a\\tb\\\\c\\'d\\\"e\\x41\\u00e9\\q' }}", {}),
    ("{{ msgs[0]['role'] }}{{ msgs[-1].content }}{{ msgs[1:]|length }}{{ msgs[:-1]|map(attribute='role')|join(',') }}{{ 'hello'[1:3] }}{{ 'héllo'[::-1] }}", {"msgs": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]}),
    ("{{ x is defined }}{{ y is defined }}{{ z is none }}{{ s is string }}{{ n is number }}{{ n is not string }}{{ m is mapping }}{{ 3 is odd }}{{ 'a' in 'cat' }}{{ 2 in [1, 2] }}{{ 'k' in m }}{{ 'q' not in m }}", {"x": 1, "z": None, "s": "s", "n": 2.5, "m": {"k": 1}}),
    ("{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 1 + 2.5 }} {{ 'a' ~ 1 ~ none }} {{ [1] + [2] }} {{ 'ab' * 3 }} {{ 10 - 3 }}", {}),
    ("{{ tools is defined }}{{ tools is none }}{{ documents is none }}{{ undefined_thing is defined }}{{ undefined_thing }}", {"tools": None, "documents": None}),
    ("{{ d|tojson }}|{{ d|tojson(indent=2) }}|{{ 'é\"\\n'|tojson }}|{{ [1, 2.0, true, none]|tojson }}", {"d": {"b": [1, {"c": "x"}], "a": None}}),
    ("{{ ms|selectattr('role', 'equalto', 'user')|list|length }}{{ ms|rejectattr('role', 'equalto', 'user')|map(attribute='content')|join }}{{ (ms|first).role }}{{ (ms|last).role }}", {"ms": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]}),
    ("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{{ d.get('a') }}{{ d.get('zz', 'dflt') }}{{ d['zz'] is defined }}", {"d": {"a": 1, "b": "two"}}),
    ("{{ 'x' if a else 'y' }}{{ 'p' if b }}{{ 'A b c'.split() }}{{ 'a,b'.split(',') }}{{ 'Hi'.upper() }}{{ 'Hi'.lower() }}{{ 'ab'.startswith('a') }}{{ 'ab'.endswith('x') }}{{ 'hello world'|title }}{{ 'x'|default('d') }}{{ nope|default('d') }}", {"a": False, "b": False}),
    ("{% for i in range(5) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 3 %}{% break %}{% endif %}{{ i }}{% endfor %}", {}),
    ("{{ [1, 'a', none, true, 1.5, {'k': 'v'}] }}|{{ none }}|{{ true }}|{{ 1.0 }}|{{ 1e-05 }}|{{ 1e20 }}|{{ 0.1 + 0.2 }}", {}),
    ("{% if x %}{{ raise_exception('bad input: ' + x) }}{% endif %}", {"x": "boom"}),
    ("{{- '  a  ' -}}   \n   {{- 'b' }}  {%- set q = 1 -%}  \n  c", {}),
    ("{{ \"}}\" }}{{ {'a': {'b': 1}}['a']['b'] }}{{ (1, 2)[1] }}", {}),
    ("{% generation %}no-op outside the mask API{% endgeneration %}", {}),
    ("{{ x.y }}", {}),
    ("{{ 'a' + 1 }}", {}),
]


def build_tokenizer():
    tok = train_bpe(True, vocab_size=900)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in EXTRA_SPECIALS])
    return tok


def expected_mask(family, text, messages, offsets):
    spans, pos = [], 0
    for m in messages:
        if m["role"] != "assistant":
            continue
        prefix, turn = TURN[family][0], TURN[family][1](m["content"])
        at = text.find(prefix + turn, pos)
        assert at >= 0, (family, turn, text)
        at += len(prefix)
        spans.append((at, at + len(turn)))
        pos = at + len(turn)
    return [int(any(s < b and e > a for a, b in spans) and e > s) for s, e in offsets]


def family_cases(family, directory, spec):
    fast = PreTrainedTokenizerFast(tokenizer_file=os.path.join(directory, "tokenizer.json"),
                                   bos_token=spec["bos_token"], eos_token=spec["eos_token"])
    fast.chat_template = spec["template"]
    cases = []
    for messages in CONVERSATIONS:
        case = {"messages": json.dumps(messages, ensure_ascii=False)}
        try:
            text = fast.apply_chat_template(messages, tokenize=False)
        except Exception as e:  # the template's raise_exception
            case["error"] = str(e)
            cases.append(case)
            continue
        case["text"] = text
        case["text_generation"] = fast.apply_chat_template(messages, tokenize=False,
                                                           add_generation_prompt=True)
        out = fast.apply_chat_template(messages, tokenize=True, return_dict=True)
        case["ids"] = list(out["input_ids"])
        enc = fast(text, add_special_tokens=False, return_offsets_mapping=True)
        assert list(enc["input_ids"]) == case["ids"]
        case["mask"] = expected_mask(family, text, messages, enc["offset_mapping"])
        cases.append(case)
    return cases


# Preference pairs: (prompt or None, chosen, rejected); None: the prompt is the turns both share.
PREFERENCE = [
    (chat((U, "What is 2+2?")), chat((A, "4")), chat((A, "Five, I think."))),
    (chat((S, "You are terse.\n"), (U, "Name a colour")), chat((A, " Blue. ")), chat((A, "I would rather not."))),
    (None, chat((U, "Say hi"), (A, "Hi!")), chat((U, "Say hi"), (A, "No."))),
]


def preference_cases(fast):
    from trl.data_utils import _tokenize, common_prefix_length, extract_prompt
    cases = []
    for prompt, chosen, rejected in PREFERENCE:
        example = {"chosen": chosen, "rejected": rejected}
        record = {"chosen": json.dumps(chosen), "rejected": json.dumps(rejected)}
        if prompt is not None:
            example["prompt"] = prompt
            record["prompt"] = json.dumps(prompt)
        else:
            example = extract_prompt(example)
        try:  # as trl/trainer/dpo_trainer.py's tokenize_fn
            prompt_ids = _tokenize(fast, example["prompt"], add_generation_prompt=True, tools=None)["input_ids"]
            chosen_ids = _tokenize(fast, example["prompt"] + example["chosen"], tools=None)["input_ids"]
            rejected_ids = _tokenize(fast, example["prompt"] + example["rejected"], tools=None)["input_ids"]
        except Exception:  # a template that refuses the layout
            continue
        prompt_len = min(common_prefix_length(prompt_ids, chosen_ids), common_prefix_length(prompt_ids, rejected_ids))
        cases.append({"record": record, "chosen": list(chosen_ids), "rejected": list(rejected_ids),
                      "prompt_len": prompt_len})
    return cases


def micro_cases():
    out = []
    for template, variables in MICRO:
        case = {"template": template, "variables": variables}
        try:
            case["output"] = _compile_jinja_template(template).render(**variables)
        except Exception as e:
            case["error"] = type(e).__name__ + ": " + str(e)
        out.append(case)
    return out


def main():
    fixtures = json.load(open(sys.argv[1], encoding="utf-8"))["templates"]
    out = sys.argv[2]
    tok = build_tokenizer()
    expected = {"families": {}, "micro": micro_cases(), "preference": {}}
    for family, spec in fixtures.items():
        directory = os.path.join(out, family)
        os.makedirs(directory, exist_ok=True)
        tok.save(os.path.join(directory, "tokenizer.json"))
        config = {"bos_token": spec["bos_token"], "eos_token": spec["eos_token"],
                  "chat_template": spec["template"]}
        json.dump(config, open(os.path.join(directory, "tokenizer_config.json"), "w"))
        expected["families"][family] = family_cases(family, directory, spec)
        fast = PreTrainedTokenizerFast(tokenizer_file=os.path.join(directory, "tokenizer.json"),
                                       bos_token=spec["bos_token"], eos_token=spec["eos_token"])
        fast.chat_template = spec["template"]
        expected["preference"][family] = preference_cases(fast)
    json.dump(expected, open(os.path.join(out, "expected.json"), "w", encoding="utf-8"),
              ensure_ascii=False, indent=1)


if __name__ == "__main__":
    main()
