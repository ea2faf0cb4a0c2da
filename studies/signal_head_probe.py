"""Would a richer signal head rank the breaks better than the draft's linear rows? (#44, after item 3: the
loss weights cannot move a linear readout, studies/signal_ablation.py.) Confidence heads fitted offline on the
same features the draft's signal rows read, compared on the same held-out breaks.

    python studies/signal_head_probe.py LABELS TRAIN_YAML --held-out 128 --out OUT.json

LABELS and the split are signal_ablation.py's (`split_labels`: the same seeded draw of held-out traces);
TRAIN_YAML gives the target and its aux layers. Every think token of the training traces
is a sample (its features: the target's three aux hidden states, concatenated; its target: the confidence
label, as the draft trains); each head is fitted with AdamW on binary cross-entropy and judged by the AUROC of
its confidence at the probed breaks of the held-out traces against the probe's outcome (as `specexit signals`
judges the draft's), with a paired bootstrap over traces against the linear head:

- `linear`: one linear row, what the draft's fc holds (the sanity check: near the draft's own AUROC);
- `mlp`: a hidden layer of 256 (GELU);
- `linear+context`, `mlp+context`: the features also carry the running mean of the features over the thinking
  so far (a stand-in for a head that attends over the context, as the draft's decoder layer does).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import yaml
from torch import nn

from pipelines.common.provenance import emit_result, provenance
from specexit_core.teachers.model_ref import resolve_model
from specexit_core.training.features import target_features
from specexit_core.training.signal_quality import auroc

sys.path.insert(0, str(Path(__file__).parent))
from signal_ablation import auroc_difference, split_labels  # noqa: E402  (the same held-out traces as the ablation)

HEADS = ("linear", "mlp", "linear+context", "mlp+context")


@torch.no_grad()
def think_features(target, rows: list[dict], layers) -> list[dict]:
    """Per trace: the aux features of its think tokens, their running mean, the confidence labels, the breaks."""
    out = []
    for r in rows:
        prompt, comp = r["prompt_token_ids"], r["completion_token_ids"]
        ids = torch.tensor([prompt + comp])
        aux, _ = target_features(target, ids, torch.ones_like(ids), layers)
        x = aux[0, len(prompt) :].float()
        m = torch.tensor(r["mask"], dtype=torch.bool)
        # the mean of the think tokens' features up to and including each token (causal)
        context = torch.cumsum(x * m[:, None], 0) / torch.clamp(torch.cumsum(m.float(), 0)[:, None], min=1)
        out.append(
            {
                "x": x,
                "context": context,
                "mask": m,
                "confidence": torch.tensor(r["confidence"], dtype=torch.float32),
                "breaks": list(r["boundaries"]),
                "outcomes": [o > 0.5 for o in r["probe_outcomes"]],
            }
        )
    return out


def inputs(trace: dict, head: str) -> torch.Tensor:
    """What a head reads at every token of a trace."""
    return torch.cat([trace["x"], trace["context"]], -1) if head.endswith("+context") else trace["x"]


def make_head(head: str, width: int) -> nn.Module:
    """A linear row or a one-hidden-layer MLP over `width` features, after a per-feature standardisation."""
    if head.startswith("linear"):
        return nn.Linear(width, 1)
    return nn.Sequential(nn.Linear(width, 256), nn.GELU(), nn.Linear(256, 1))


def fit(head: str, train: list[dict], epochs: int, seed: int = 0) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """A head fitted on every think token of the training traces (BCE on the confidence label)."""
    torch.manual_seed(seed)
    x = torch.cat([inputs(t, head)[t["mask"]] for t in train])
    y = torch.cat([t["confidence"][t["mask"]] for t in train])
    mean, std = x.mean(0), x.std(0).clamp(min=1e-6)
    x = (x - mean) / std
    model = make_head(head, x.shape[1])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-2)
    loss_fn = nn.BCEWithLogitsLoss()
    for _ in range(epochs):
        for idx in torch.randperm(len(x)).split(512):
            opt.zero_grad()
            loss_fn(model(x[idx]).squeeze(-1), y[idx]).backward()
            opt.step()
    return model.eval(), mean, std


@torch.no_grad()
def break_scores(model, mean, std, head: str, held: list[dict]) -> list[tuple[list[float], list[bool]]]:
    """Per held-out trace: the head's confidence at each probed break, and the probe's outcome."""
    out = []
    for t in held:
        p = torch.sigmoid(model((inputs(t, head) - mean) / std).squeeze(-1))
        out.append(([float(p[b]) for b in t["breaks"]], t["outcomes"]))
    return out


def pooled_auroc(scores) -> float:
    """AUROC over the breaks of every trace of `break_scores`' output."""
    return auroc([x for sc, _ in scores for x in sc], [y for _, ys in scores for y in ys])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("labels")
    ap.add_argument("train_yaml")
    ap.add_argument("--held-out", type=int, default=128)
    ap.add_argument("--epochs", default="4", help="passes over the training tokens; several: 1,4,12")
    ap.add_argument("--out")
    a = ap.parse_args()
    from transformers import AutoModelForCausalLM

    recipe = yaml.safe_load(Path(a.train_yaml).read_text())
    torch.set_num_threads(2)
    target = AutoModelForCausalLM.from_pretrained(resolve_model(recipe["target"]), dtype=torch.float32).eval()
    train_rows, held_rows = split_labels(a.labels, a.held_out)
    layers = tuple(recipe["aux_layer_ids"])
    train, held = think_features(target, train_rows, layers), think_features(target, held_rows, layers)
    by_epochs = {}
    for epochs in map(int, a.epochs.split(",")):
        scores, heads = {}, {}
        for head in HEADS:
            model, mean, std = fit(head, train, epochs)
            scores[head] = break_scores(model, mean, std, head, held)
            heads[head] = {"confidence_auroc": pooled_auroc(scores[head])}
            if head != HEADS[0]:
                heads[head]["vs_linear"] = auroc_difference(scores[head], scores[HEADS[0]])
            print(f"epochs {epochs}, {head}: {json.dumps(heads[head])}", flush=True)
        by_epochs[str(epochs)] = heads
    res = {
        "what": __doc__.split("\n\n")[0].replace("\n", " "),
        "labels": a.labels,
        "train_recipe": a.train_yaml,
        "aux_layer_ids": list(layers),
        "traces": {"train": len(train), "held_out": len(held)},
        "think_tokens_trained_on": int(sum(int(t["mask"].sum()) for t in train)),
        "held_out_breaks": sum(len(t["breaks"]) for t in held),
        "heads_by_epochs": by_epochs,
        "provenance": provenance(" ".join(sys.argv)),
    }
    emit_result(res, a.out)


if __name__ == "__main__":
    main()
