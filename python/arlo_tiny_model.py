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

`--warm-up-sums STEPS` (with `--init-range 0.02`: the tests' far-from-uniform 0.35 trains poorly)
first trains the model on arlo's arithmetic tasks ("23+45=" -> "68", then <|im_end|>), the supervised
warm-up that orchestrator.sft_warmup_steps cannot do for a vLLM model (arlo holds reference answers
only as the built-in tokenizer's ids): `make run-vllm` starts RL from 600 such steps (greedy pass@1
about 0.25). Without it the weights are random, as every test other than tests/vllm/learning_test.py
uses them.
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


def write(out, seed, layers=2, hidden=128, heads=4, kv_heads=2, head_dim=32, intermediate=256, init_range=0.35,
          sums_steps=0, sums_lr=3e-3, sums_batch=64):
    """Writes the model directory `out`; returns its tree_checksum. sums_steps > 0: first trains the
    model that many steps on two-digit sums (warm_up_on_sums), so that RL starts from a model that is
    sometimes right."""
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
        initializer_range=init_range,
        bos_token_id=None, eos_token_id=ids[IM_END], pad_token_id=ids[ENDOFTEXT],
        torch_dtype="float32")
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config).to(torch.float32)
    if sums_steps > 0:
        warm_up_on_sums(model, tok, ids[IM_END], seed, sums_steps, sums_lr, sums_batch)
    model.eval()
    model.save_pretrained(out, safe_serialization=True)
    return tree_checksum(out)


def sum_task(rng, low=10, high=49):
    """One task of arlo's arithmetic environment (env.max_operand 49, two terms): "23+45=" -> "68"."""
    a, b = rng.randint(low, high), rng.randint(low, high)
    return f"{a}+{b}=", str(a + b)


def warm_up_on_sums(model, tok, eos_id, seed, steps, lr, batch):
    """Supervised warm-up (what orchestrator.sft_warmup_steps does for arlo-worker, which arlo cannot do
    for a vLLM model: its reference answers are token ids of the built-in tokenizer): `steps` AdamW
    steps of cross-entropy on the answer tokens and <|im_end|> of `batch` random sums each, the
    prompt tokens unweighted. Deterministic for a seed on one thread."""
    import torch

    rng = random.Random(seed * 7919 + 1)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.99), weight_decay=0.0)
    model.train()
    for _ in range(steps):
        rows, targets = [], []
        for _ in range(batch):
            prompt, answer = sum_task(rng)
            p, a = tok.encode(prompt).ids, tok.encode(answer).ids + [eos_id]
            rows.append(p + a)
            targets.append([-100] * len(p) + a)
        width = max(map(len, rows))
        ids = torch.tensor([r + [eos_id] * (width - len(r)) for r in rows])
        labels = torch.tensor([t + [-100] * (width - len(t)) for t in targets])
        mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    return float(loss.detach())


def greedy_pass_at_1(model_dir, n=128, seed=7):
    """Greedy exact answers on n random sums (transformers, not vLLM): a check of a warm-up by hand."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    tok = AutoTokenizer.from_pretrained(model_dir)
    rng, right = random.Random(seed), 0
    for _ in range(n):
        prompt, answer = sum_task(rng)
        ids = torch.tensor([tok.encode(prompt)])
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=6, do_sample=False, eos_token_id=tok.eos_token_id,
                                 pad_token_id=tok.pad_token_id)
        right += tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True).strip() == answer
    return right / n


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
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--intermediate", type=int, default=256)
    p.add_argument("--init-range", type=float, default=0.35,
                   help="std of the random weights (0.35: far-from-uniform logprobs for the tests' comparisons)")
    p.add_argument("--warm-up-sums", type=int, default=0, metavar="STEPS",
                   help="train this many supervised steps on two-digit sums before writing (0: random weights)")
    p.add_argument("--warm-up-lr", type=float, default=3e-3)
    p.add_argument("--warm-up-batch", type=int, default=64)
    p.add_argument("--check", action="store_true", help="then print the greedy pass@1 on 128 held-out sums")
    a = p.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    checksum = write(a.out, a.seed, layers=a.layers, hidden=a.hidden, intermediate=a.intermediate,
                     init_range=a.init_range, sums_steps=a.warm_up_sums, sums_lr=a.warm_up_lr,
                     sums_batch=a.warm_up_batch)
    if a.check:
        print(f"arlo_tiny_model: greedy pass@1 on 128 sums {greedy_pass_at_1(a.out):.3f}")
    print(f"arlo_tiny_model: {a.out} seed {a.seed} sha256 {checksum}")


if __name__ == "__main__":
    main(sys.argv[1:])
