"""Writes a tiny Hugging Face model directory from a seed: a Qwen3-architecture causal LM with random
weights and a byte-level BPE tokenizer built here, with a chat template. Nothing is downloaded.

    .venv/bin/python python/arlo_tiny_model.py OUT_DIR [--seed 0]      (or scripts/make-tiny-model)

The same seed (and the same pinned transformers/torch, i.e. the same python/requirements.lock) gives
byte-identical files; the last line printed is a sha256 over them (`arlo_tiny_model.tree_checksum`).
The model is small enough for vLLM's CPU build on two cores: 2 layers, hidden 128, 4 query heads and
2 key/value heads of 32 (vLLM's CPU attention takes head sizes 32, 64, 80, ...), float32 weights.
The tokenizer covers printable ASCII, tab and newline (every token decodes to ASCII text on its own,
so any id sequence the model produces decodes to the same text whole or token by token), plus merges
for the arithmetic and reverse_text tasks' text (digits, '+', '=') and the chat roles.
"""

import argparse
import hashlib
import json
import os
import random
import sys

ENDOFTEXT, IM_START, IM_END, UNK = "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|unk|>"
SPECIALS = [ENDOFTEXT, IM_START, IM_END, UNK]
# A Qwen-style (ChatML) template: one <|im_start|>role\ncontent<|im_end|>\n per message.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# Words whose letters are merged into one token each (with and without a leading space).
WORDS = ["user", "assistant", "system", "the", "sum", "of", "is", "answer", "reverse", "text",
         "what", "add", "plus", "equals", "ok", "no", "yes"]


def byte_level_chars():
    """GPT-2's byte -> printable character map (the ByteLevel pre-tokenizer's alphabet)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, n = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + n)
            n += 1
    return chars


def build_tokenizer_json(seed):
    """The tokenizer, made from explicit vocabulary and merges (no trainer, so no hash-order effects)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, AddedToken

    m = byte_level_chars()
    vocab, merges = {}, []
    for s in SPECIALS:
        vocab[s] = len(vocab)
    for b in [0x09, 0x0A] + list(range(0x20, 0x7F)):
        vocab[m[b]] = len(vocab)

    def add_merges(piece):
        cur = piece[0]
        for ch in piece[1:]:
            nxt = cur + ch
            if nxt not in vocab:
                merges.append((cur, ch))
                vocab[nxt] = len(vocab)
            cur = nxt

    space = m[0x20]
    for w in WORDS:
        add_merges(w)
        add_merges(space + w)
    # Two-digit numbers (the tasks' operands and answers), in an order the seed picks.
    pairs = [f"{a}{b}" for a in range(10) for b in range(10)]
    random.Random(seed).shuffle(pairs)
    for p in pairs[:60]:
        add_merges(p)
    add_merges("+=")

    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=UNK, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    return tok, len(vocab)


def write(out, seed, layers=2, hidden=128, heads=4, kv_heads=2, head_dim=32, intermediate=256):
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    os.makedirs(out, exist_ok=True)
    tok, vocab_size = build_tokenizer_json(seed)
    tok.save(os.path.join(out, "tokenizer.json"), pretty=True)
    ids = {s: tok.token_to_id(s) for s in SPECIALS}
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 2048,
        "bos_token": None,
        "eos_token": IM_END,
        "pad_token": ENDOFTEXT,
        "unk_token": UNK,
        "additional_special_tokens": [IM_START],
        "clean_up_tokenization_spaces": False,
        "add_bos_token": False,
        "add_eos_token": False,
        "chat_template": CHAT_TEMPLATE,
    }
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(tokenizer_config, f, indent=2, sort_keys=True)
        f.write("\n")

    config = Qwen3Config(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=intermediate,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        head_dim=head_dim, max_position_embeddings=2048, tie_word_embeddings=True,
        # Larger than Qwen's 0.02, so that the random model's next-token distributions are far from
        # uniform: logprobs that differ by several nats make a comparison with vLLM's meaningful.
        initializer_range=0.35,
        bos_token_id=None, eos_token_id=ids[IM_END], pad_token_id=ids[ENDOFTEXT],
        torch_dtype="float32")
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config).to(torch.float32).eval()
    model.save_pretrained(out, safe_serialization=True)
    return tree_checksum(out)


def tree_checksum(out):
    """sha256 over every file of the directory: its name, then its bytes, in name order."""
    h = hashlib.sha256()
    for name in sorted(os.listdir(out)):
        path = os.path.join(out, name)
        if os.path.isfile(path):
            h.update(name.encode() + b"\0")
            with open(path, "rb") as f:
                h.update(f.read())
    return h.hexdigest()


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", help="directory to write (created; files in it are replaced)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    print(f"arlo_tiny_model: {a.out} seed {a.seed} sha256 {write(a.out, a.seed)}")


if __name__ == "__main__":
    main(sys.argv[1:])
