"""The drafter's test-time-training unroll reduced to numbers two attention paths must agree on:
the logits and every weight's gradient of a weighted sum over real positions. Shared by the
Llama-layer and MLA-layer comparisons."""

from __future__ import annotations

import torch

from engine.model.draft import Eagle3Draft, valid_positions


def loss_and_grads(m: Eagle3Draft, aux: torch.Tensor, ids: torch.Tensor, att: torch.Tensor,
                   k: int, weights: list[torch.Tensor], as_rows: bool = False
                   ) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
    """Logits and the gradients of a weighted sum over real positions; `as_rows`: the logits
    of those positions alone (`ttt_forward(rows=)`, as the trainer asks), returned [B,T,V]
    with zeros elsewhere."""
    m.zero_grad(set_to_none=True)
    t = ids.shape[1]
    real = att.bool()
    keeps = [real & valid_positions(t, i)[None] for i in range(k)]  # real positions only
    rows = [kp.reshape(-1).nonzero().squeeze(1) for kp in keeps] if as_rows else None
    logits = m.ttt_forward(aux, ids, k, attention_mask=att, rows=rows)
    loss = aux.new_zeros(())
    for i, lg in enumerate(logits):
        if rows is not None:
            loss = loss + (lg * weights[i].reshape(-1, lg.shape[-1])[rows[i]]).sum()
            full = lg.new_zeros(weights[i].shape).reshape(-1, lg.shape[-1])
            full[rows[i]] = lg
            logits[i] = full.view(weights[i].shape)
        else:
            loss = loss + (lg * weights[i] * keeps[i][..., None]).sum()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
    return [lg.detach() for lg in logits], grads
