#!/usr/bin/env python3
"""Write tokenizer/testdata/golden.json.gz: Hugging Face's answers for the Go tests.

Needs tokenizers (0.23) and transformers (5.x). Run from the repository root:
    python3 tokenizer/scripts/golden.py [--out tokenizer/testdata/golden.json.gz]

It records, for the embedded Qwen3 tokenizer.json (tokenizer/qwen3/):
  encode: for each string of golden_inputs.inputs(),
          Tokenizer.from_file(tokenizer.json).encode(s, add_special_tokens=False).ids
          and decode(ids, skip_special_tokens=False);
  decode: decode() of random id sequences (incomplete UTF-8, special tokens);
  flags:  encodings with extra added tokens using lstrip, rstrip, single_word
          and normalized;
  chat:   apply_chat_template(messages, tokenize=False, add_generation_prompt,
          enable_thinking) of AutoTokenizer over tokenizer.json +
          tokenizer_config.json, and the ids of that text;
  corpus: the sha256 and length of the ids of the whole benchmark corpus.
"""
import argparse
import gzip
import hashlib
import json
import os
import random
import shutil
import sys
import tempfile
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import golden_inputs  # noqa: E402

SHA256 = "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4"


def ids_digest(ids):
    """sha256 of the ids written as decimal numbers joined by commas."""
    return hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest()


CONVERSATIONS = [
    ("single_user", [{"role": "user", "content": "Hello"}]),
    ("system_user", [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is 2+2?"},
    ]),
    ("multi_turn", [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 3+3?"},
    ]),
    ("history_with_think", [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "<think>\nThe user greets.\n</think>\n\nHello! How can I help?"},
        {"role": "user", "content": "Tell me a joke."},
    ]),
    ("last_assistant_think", [
        {"role": "user", "content": "Solve x+1=3."},
        {"role": "assistant", "content": "<think>\n\nx = 3 - 1 = 2\n\n</think>\n\n\nx = 2"},
    ]),
    ("last_assistant_plain", [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "plain answer"},
    ]),
    ("assistant_think_before_last_query", [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "reasoning without open tag</think>answer one"},
        {"role": "assistant", "content": "second answer"},
        {"role": "user", "content": "second"},
        {"role": "assistant", "content": "pre<think>inner</think>post"},
    ]),
    ("tools", [
        {"role": "user", "content": "What's the weather in Paris?"},
        {"role": "assistant", "content": "Let me check."},
        {"role": "tool", "content": "{\"temp\": 18}"},
        {"role": "tool", "content": "{\"sky\": \"clear\"}"},
        {"role": "assistant", "content": "<think>\nTool says 18 and clear.\n</think>\n\nIt is 18°C and clear."},
    ]),
    ("tool_response_user", [
        {"role": "user", "content": "Do it."},
        {"role": "assistant", "content": "<think>plan</think>Calling."},
        {"role": "user", "content": "<tool_response>\ndone\n</tool_response>"},
        {"role": "assistant", "content": "<think>\nok\n</think>\nDone."},
    ]),
    ("system_in_middle", [
        {"role": "user", "content": "a"},
        {"role": "system", "content": "b"},
        {"role": "user", "content": "c"},
    ]),
    ("unicode_multiline", [
        {"role": "system", "content": "Réponds en français.\nSois concis."},
        {"role": "user", "content": "你好！\n\n  Explain 🙂 in one line.\r\n"},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": ""},
    ]),
    ("only_system", [{"role": "system", "content": "Only a system prompt."}]),
    ("assistant_first", [
        {"role": "assistant", "content": "I start."},
        {"role": "user", "content": "ok"},
    ]),
]


def chat_renderers(tok_json_path, config_path):
    """Ways to run transformers' apply_chat_template, most faithful first."""
    import transformers

    template = json.load(open(config_path))["chat_template"]

    def auto():
        d = tempfile.mkdtemp()
        shutil.copy(tok_json_path, os.path.join(d, "tokenizer.json"))
        shutil.copy(config_path, os.path.join(d, "tokenizer_config.json"))
        return transformers.AutoTokenizer.from_pretrained(d)

    def fast():
        return transformers.PreTrainedTokenizerFast(tokenizer_file=tok_json_path, chat_template=template)

    yield "AutoTokenizer", auto
    yield "PreTrainedTokenizerFast", fast


def chat_cases(tok_json_path, config_path, hf_tok):
    errors = []
    for name, make in chat_renderers(tok_json_path, config_path):
        try:
            at = make()
            out = []
            for conv, msgs in CONVERSATIONS:
                for gen in (False, True):
                    for think in (False, True):
                        text = at.apply_chat_template(
                            msgs, tokenize=False, add_generation_prompt=gen, enable_thinking=think
                        )
                        out.append({
                            "name": conv, "messages": msgs, "add_generation_prompt": gen,
                            "enable_thinking": think, "text": text,
                            "ids": hf_tok.encode(text, add_special_tokens=False).ids,
                        })
            return out, f"{name} ({type(at).__name__})"
        except Exception:
            errors.append(traceback.format_exc())
            print(f"chat template via {name} failed:\n{errors[-1]}", file=sys.stderr)
    raise RuntimeError("no way to apply the chat template worked")


def decode_cases(tok, n=80, seed=7):
    rng = random.Random(seed)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    byte_ids = [tok.token_to_id(c) for c in bytes_to_unicode_chars()]
    cases = []
    for i in range(n):
        kind = i % 4
        if kind == 0:  # anything, specials included
            ids = [rng.randrange(vocab) for _ in range(rng.randint(1, 12))]
        elif kind == 1:  # single bytes: broken and valid UTF-8
            ids = [byte_ids[rng.randrange(128, 256)] for _ in range(rng.randint(1, 8))]
        elif kind == 2:  # bytes and ASCII mixed
            ids = [byte_ids[rng.choice([rng.randrange(256), rng.randrange(0x80, 0xC0), 0xE4, 0xF0, 0x41])]
                   for _ in range(rng.randint(1, 10))]
        else:  # a valid text cut into byte tokens, with a token dropped
            s = rng.choice(["héllo 世界 🙂", "Привет", "👨‍👩‍👧", "a\u0301b"])
            ids = [byte_ids[b] for b in s.encode()]
            if len(ids) > 2:
                del ids[rng.randrange(len(ids))]
        cases.append({"ids": ids, "text": tok.decode(ids, skip_special_tokens=False)})
    return cases


def bytes_to_unicode_chars():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, cs))
    return [chr(table[b]) for b in range(256)]


def flag_cases(raw):
    """Encodings with extra added tokens that use lstrip, rstrip, single_word
    and normalized (golden_inputs.FLAG_TOKENS, appended to added_tokens)."""
    from tokenizers import Tokenizer

    d = json.loads(raw)
    next_id = max(t["id"] for t in d["added_tokens"]) + 1
    for i, t in enumerate(golden_inputs.FLAG_TOKENS):
        d["added_tokens"].append(dict(t, id=next_id + i))
    tok = Tokenizer.from_str(json.dumps(d))
    return {
        "added_tokens": golden_inputs.FLAG_TOKENS,
        "ids": {t["content"]: tok.token_to_id(t["content"]) for t in golden_inputs.FLAG_TOKENS},
        "cases": [{"text": s, "ids": tok.encode(s, add_special_tokens=False).ids}
                  for s in golden_inputs.FLAG_TEXTS],
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(PKG, "testdata", "golden.json.gz"))
    args = ap.parse_args()

    import tokenizers
    from tokenizers import Tokenizer

    raw = gzip.open(os.path.join(PKG, "qwen3", "tokenizer.json.gz")).read()
    assert hashlib.sha256(raw).hexdigest() == SHA256, "embedded tokenizer.json has the wrong sha256"
    d = tempfile.mkdtemp()
    tok_path = os.path.join(d, "tokenizer.json")
    with open(tok_path, "wb") as f:
        f.write(raw)
    tok = Tokenizer.from_file(tok_path)
    corpus = gzip.open(os.path.join(PKG, "testdata", "corpus.txt.gz")).read().decode("utf-8")

    golden = {"versions": {"tokenizers": tokenizers.__version__, "python": sys.version.split()[0]}}
    enc = []
    for name, s in golden_inputs.inputs(corpus):
        ids = tok.encode(s, add_special_tokens=False).ids
        enc.append({"name": name, "text": s, "ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False)})
    golden["encode"] = enc
    golden["decode"] = decode_cases(tok)
    ids = tok.encode(corpus, add_special_tokens=False).ids
    golden["flags"] = flag_cases(raw)
    golden["corpus"] = {"bytes": len(corpus.encode()), "tokens": len(ids), "ids_sha256": ids_digest(ids)}
    try:
        import transformers

        golden["versions"]["transformers"] = transformers.__version__
        golden["chat"], golden["versions"]["chat_tokenizer_class"] = chat_cases(
            tok_path, os.path.join(PKG, "qwen3", "tokenizer_config.json"), tok)
    except Exception:
        traceback.print_exc()
        golden["chat_error"] = traceback.format_exc()

    data = json.dumps(golden, ensure_ascii=False, separators=(",", ":")).encode()
    with open(args.out, "wb") as f:
        f.write(gzip.compress(data, compresslevel=9, mtime=0))
    print(f"{args.out}: {len(enc)} encode, {len(golden['decode'])} decode, "
          f"{len(golden.get('chat', []))} chat cases; corpus {golden['corpus']}; {golden['versions']}")


if __name__ == "__main__":
    main()
