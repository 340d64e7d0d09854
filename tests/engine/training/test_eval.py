"""eval: vLLM-style acceptance counting, checked against real speculative decoding."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from engine.data.target import Target
from engine.training.evaluate import Acceptance, greedy_continue, load_draft, prompts_from, replay
from tests.engine_helpers import run_engine

pytest_plugins = ("tests.demo_workspace",)

K = 3


def test_eval_json(demo_dir: Path) -> None:
    p = run_engine("eval", "--draft", str(demo_dir / "public-drafter"), "--target",
                   str(demo_dir / "target"), "--data", str(demo_dir / "eval"), "--steps", str(K),
                   "--max-samples", "40", "--max-new-tokens", "32", "--json")
    res = json.loads(p.stdout)
    assert res["samples"] == 40 and res["steps"] == K and res["drafts"] > 0
    pos = res["per_position"]
    assert len(pos) == K and all(1 >= a >= b >= 0 for a, b in zip(pos, pos[1:], strict=False))
    # vLLM: mean acceptance length = 1 + accepted / drafts = 1 + sum of per-position rates
    assert res["acceptance_length"] == pytest.approx(1 + res["accepted"] / res["drafts"])
    assert res["acceptance_length"] == pytest.approx(1 + sum(pos))
    assert res["acceptance_length"] > 1.5  # the public drafter knows most of this target's tasks


@torch.no_grad()
def speculative_decode(target: Target, draft: torch.nn.Module, prompt: list[int], stop_at: int,
                       acc: Acceptance) -> list[int]:
    """Real greedy speculative decoding: the target verifies drafts with its own forward pass."""
    seq = list(prompt)
    logits = target.model(torch.tensor([seq])).logits[0, -1]
    seq.append(int(logits.argmax()))  # prefill's token: the draft's first input
    while len(seq) - 1 + K < stop_at:  # only full windows, as the replay counts them
        aux, _ = target.features(torch.tensor([seq[:-1]]))
        drafts = draft.draft_greedy(aux.float(), torch.tensor([seq]), K)[0].tolist()
        out = target.model(torch.tensor([seq + drafts])).logits[0]  # verify all K at once
        greedy = out[len(seq) - 1:].argmax(-1).tolist()  # K+1 target choices
        a = 0
        while a < K and drafts[a] == greedy[a]:
            a += 1
        acc.add(a)
        seq += drafts[:a] + [greedy[a]]  # accepted drafts, then the target's own token
    return seq


def test_replay_counts_what_speculative_decoding_accepts(demo_dir: Path) -> None:
    torch.set_num_threads(1)
    target = Target.load(str(demo_dir / "target"), device="cpu")
    draft = load_draft(str(demo_dir / "public-drafter"), target)
    for prompt in prompts_from(str(demo_dir / "eval"), 4):
        full = greedy_continue(target, prompt, 24)
        replayed, real = Acceptance(K), Acceptance(K)
        aux, _ = target.features(torch.tensor([full]))
        replay(draft, aux.float(), torch.tensor(full), len(prompt) - 1, K, replayed)
        seq = speculative_decode(target, draft, prompt, len(full), real)
        assert seq[:len(full)] == full[:len(seq)]  # greedy speculation never changes the text
        assert real.drafts > 0 and replayed.report() == real.report()


def test_fast_eval_counts_what_the_reference_path_counts(demo_dir: Path) -> None:
    """Batched generation + drafts from every position give the one-window-at-a-time counts."""
    from engine.training.evaluate import evaluate
    args = (str(demo_dir / "public-drafter"), str(demo_dir / "target"), str(demo_dir / "eval"))
    ref = evaluate(*args, k=K, max_samples=12, max_new_tokens=24, reference=True)
    # one sample a batch, ragged batches with padding on both sides, batches cut by tokens
    for bs, bt in ((1, 32768), (5, 32768), (64, 150)):
        fast = evaluate(*args, k=K, max_samples=12, max_new_tokens=24, batch_size=bs,
                        batch_tokens=bt)
        for key in ("drafts", "accepted", "per_position", "generated_tokens", "samples"):
            assert fast[key] == ref[key], (bs, bt, key)
        assert ref["drafts"] > 0


def test_batches_keep_both_limits_and_every_sample_once() -> None:
    from engine.training.evaluate import batches
    lengths = [30, 5, 12, 5, 400, 7, 12, 30, 1]
    for size, budget in ((64, 32768), (2, 32768), (64, 100), (3, 90), (1, 1)):
        groups = batches(lengths, 20, size, budget)
        assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
        for g in groups:
            assert len(g) <= size
            widest = max(lengths[i] for i in g) + 20
            assert len(g) == 1 or len(g) * widest <= budget, (size, budget, g)
        flat = [lengths[i] for g in groups for i in g]
        assert flat == sorted(flat)  # similar lengths together
    assert len(batches(lengths, 20, 64, 32768)) == 1
