"""The demo's tiny target: a synthetic chat task mix, a locally trained tokenizer, a small Llama.

Nothing is downloaded. The target is a transformers `LlamaForCausalLM` (7 layers, hidden 64, 2
heads of 32) trained for a few seconds (200 steps of 8 x 96 tokens) on synthetic chats (counting,
spelling, weekdays, colours, greetings, letters, word reversal), so that its greedy replies are
structured, mostly right and sometimes wrong: text a drafter can learn to predict, with real
disagreements between a weak and a good drafter.
Tokenizer: byte-level BPE trained with the `tokenizers` library, wrapped as a
`PreTrainedTokenizerFast` with a ChatML-style chat template; saved with `save_pretrained`.
"""

from __future__ import annotations

import random
import time

import torch

from engine.events import Emitter

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIAL_TOKENS = ["<|pad|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
VOCAB_SIZE = 512

WORDS = ["apple", "river", "stone", "cloud", "tiger", "piano", "garden", "rocket", "silver",
         "window", "forest", "candle", "bridge", "orange", "planet", "summer", "winter", "mirror",
         "castle", "dragon", "pencil", "violet", "marble", "thunder", "coffee", "butter", "lemon",
         "ocean", "shadow", "meadow"]
DAYS = ["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"]
COLOURS = {"sky": "blue", "grass": "green", "snow": "white", "coal": "black", "sun": "yellow",
           "blood": "red", "sea": "blue", "banana": "yellow", "leaf": "green", "cherry": "red",
           "night": "black", "carrot": "orange", "plum": "purple", "rose": "red", "lime": "green"}
NAMES = ["alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy",
         "mallory", "oscar", "peggy", "trent", "victor", "walter"]
LETTERS = "abcdefghijklmnopqrstuvwxyz"
TASKS = ("count", "spell", "day", "colour", "greet", "letters", "reverse")


def task(rng: random.Random, kinds: tuple[str, ...] = TASKS) -> tuple[str, str]:
    """One (user message, reference answer) pair of a random kind among `kinds`."""
    k = rng.choice(kinds)
    if k == "count":
        a = rng.randrange(0, 30)
        b = a + rng.randrange(3, 10)
        return f"count from {a} to {b}", ", ".join(str(i) for i in range(a, b + 1)) + "."
    if k == "spell":
        w = rng.choice(WORDS)
        return f"spell the word {w}", "-".join(w) + "."
    if k == "day":
        d = rng.randrange(7)
        nxt = DAYS[(d + 1) % 7]
        return f"what day comes after {DAYS[d]}?", f"the day after {DAYS[d]} is {nxt}."
    if k == "colour":
        o = rng.choice(sorted(COLOURS))
        return f"what color is the {o}?", f"the {o} is {COLOURS[o]}."
    if k == "greet":
        n = rng.choice(NAMES)
        return f"my name is {n}.", f"hello {n}! nice to meet you. how can i help you today?"
    if k == "letters":
        i = rng.randrange(0, 18)
        j = i + rng.randrange(3, 8)
        letters = " ".join(LETTERS[i:j + 1]) + "."
        return f"list the letters from {LETTERS[i]} to {LETTERS[j]}", letters
    w3 = rng.sample(WORDS, 3)
    return f"reverse the words {' '.join(w3)}", " ".join(reversed(w3)) + "."


def chats(n: int, seed: int, kinds: tuple[str, ...] = TASKS, answers: bool = True
          ) -> list[list[dict[str, str]]]:
    """n synthetic chats of 1-3 turns; assistant turns hold reference answers or are left out."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        turns: list[dict[str, str]] = []
        for _ in range(rng.choice((1, 1, 2, 3))):
            user, ref = task(rng, kinds)
            turns.append({"role": "user", "content": user})
            if answers:
                turns.append({"role": "assistant", "content": ref})
        out.append(turns)
    return out


def build_tokenizer(corpus: list[list[dict[str, str]]]):  # -> PreTrainedTokenizerFast
    """Byte-level BPE trained on the corpus' texts, with the ChatML-style template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    texts = [t["content"] for c in corpus for t in c] + ["user", "assistant", "system"]
    bpe.train_from_iterator(texts, trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>",
                                  pad_token="<|pad|>", model_max_length=512)
    tok.chat_template = CHAT_TEMPLATE
    return tok


def build_target(tok, corpus: list[list[dict[str, str]]], steps: int, seed: int,
                 ev: Emitter | None = None, seq_len: int = 96, batch: int = 8,
                 lr: float = 1e-2, warmup: int = 10):
    """A 7-layer Llama (hidden 64, 2 heads of 32, 1 key/value head) trained with next-token loss
    on the rendered corpus. Shapes a real vLLM serves on a CPU: its CPU attention takes head
    sizes 32, 64, 80, ... only, and with 7 layers the default aux ids 2, N//2, N-3 are distinct
    (vLLM de-duplicates repeated ones)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    # rope_theta: transformers 4.x's field; 5.x still takes it and files it under rope_parameters
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64,
                      intermediate_size=192, num_hidden_layers=7, num_attention_heads=2,
                      num_key_value_heads=1, head_dim=32,
                      max_position_embeddings=512, rms_norm_eps=1e-5, rope_theta=10000.0,
                      tie_word_embeddings=False, pad_token_id=tok.pad_token_id,
                      eos_token_id=tok.eos_token_id, bos_token_id=None)
    model = LlamaForCausalLM(cfg)
    stream = [i for c in corpus
              for i in tok(tok.apply_chat_template(c, tokenize=False),
                           add_special_tokens=False)["input_ids"]]
    data = torch.tensor(stream)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    gen = torch.Generator().manual_seed(seed)
    start = time.monotonic()
    for s in range(steps):
        starts = torch.randint(0, len(data) - seq_len - 1, (batch,), generator=gen)
        x = torch.stack([data[i:i + seq_len] for i in starts.tolist()])
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        for g in opt.param_groups:  # warmup, then linear decay: a short run still settles
            g["lr"] = lr * min((s + 2) / (warmup + 1), 1 - (s + 1) / steps)
        if ev is not None:
            ev.progress(s + 1, steps, unit="step", desc="demo target")
    model.eval()
    if ev is not None:
        ev.log(f"demo target: {steps} steps in {time.monotonic() - start:.1f}s, "
               f"last loss {loss.item():.3f}", level="debug")
    return model
