"""Step rows -> training sequences -> flattened micro-batch tensors.

A training sequence is one step (prompt + response) or, with append-only packing, a whole
trajectory (its last step's prompt + response, covering every step's response). Only positions
that predict a response token get logits, so a micro-batch carries flat token lists.

A micro-batch is either left-padded sequences (`collate`) or one prefix tree (`collate_tree`):
every distinct prefix of its sequences is one position, attending to its ancestors only, so the
system prompt, a group's task prompt and a trajectory's earlier steps are processed once. A
token's hidden state depends only on the tokens before it and its position, so the tree gives
the same logits, loss and gradients as the padded batch (tests/unit/test_prefix_tree.py). In a
VLM's prompt equal image tokens may stand for different pictures: the tree merges on `tree_keys`,
where each image token carries its picture's digest.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import torch


@dataclass(frozen=True)
class TrainRow:
    """One step row as the update needs it."""

    prompt_ids: list[int]
    response_ids: list[int]
    old_logprobs: list[float]
    advantage: float
    return_: float = 0.0
    value: float = 0.0
    trajectory_id: str = ""
    step_index: int = 0
    # response tokens of all of this row's trajectory's rows in the update (the weight unit of
    # traj-mean-token-mean); 0 = not counted: the row is taken as its own trajectory
    trajectory_tokens: int = 0
    # per response token: the off-policy correction's weight on its policy-gradient loss (with
    # old_logprobs then the proximal policy's); None = 1 each
    token_weights: list[float] | None = None
    # the group (a task's episodes) the row's trajectory belongs to: trainer.mini_batches keeps
    # a group in one mini-batch; "" = the trajectory is its own group
    group_id: str = ""
    # the images the prompt shows, in prompt order (RGB PIL images, read from the run's image
    # store): a VLM's forward gets their pixel values
    images: tuple = ()
    # the role that took the step (a team's) and the adapter it trains: its role's own, or None
    # for the shared policy; a micro-batch holds one role's rows (one adapter per forward)
    role: str | None = None
    adapter: str | None = None


def with_trajectory_tokens(rows: list[TrainRow]) -> list[TrainRow]:
    """`rows` with `trajectory_tokens` set: the response tokens of each trajectory's rows."""
    totals: dict[str, int] = {}
    for row in rows:
        totals[row.trajectory_id] = totals.get(row.trajectory_id, 0) + len(row.response_ids)
    return [replace(r, trajectory_tokens=totals[r.trajectory_id]) for r in rows]


def trajectory_mass(rows: list[TrainRow], indices: Sequence[int]) -> float:
    """How many trajectories the rows `indices` make up, each row counting its share of its
    trajectory's tokens (all of an update's rows: its trajectories, whole or not)."""
    return sum(len(rows[i].response_ids) / _trajectory_tokens(rows[i]) for i in indices)


def _trajectory_tokens(row: TrainRow) -> int:
    return max(row.trajectory_tokens, len(row.response_ids), 1)


@dataclass(frozen=True)
class TrainSequence:
    """Token ids of one forward pass and, per step in it, (row index, response start, stop)."""

    input_ids: list[int]
    spans: list[tuple[int, int, int]]


def is_append_only(steps: Sequence[tuple[Sequence[int], Sequence[int]]]) -> bool:
    """True when each step's (prompt_ids, response_ids) prompt starts with the previous step's
    prompt + response: one causal forward over the last step then covers every step."""
    for (prev_prompt, prev_response), (prompt, _) in itertools.pairwise(steps):
        prefix = list(prev_prompt) + list(prev_response)
        if list(prompt[: len(prefix)]) != prefix:
            return False
    return True


def build_sequences(rows: list[TrainRow], pack: bool) -> tuple[list[TrainSequence], int]:
    """One sequence per row, or with `pack` one per append-only trajectory (others stay
    per-step). Returns the sequences and how many trajectories were packed."""
    if not pack:
        return [_single(i, r) for i, r in enumerate(rows)], 0
    by_traj: dict[str, list[int]] = {}
    for i, row in enumerate(rows):
        by_traj.setdefault(row.trajectory_id, []).append(i)
    sequences, packed = [], 0
    for indices in by_traj.values():
        indices.sort(key=lambda i: rows[i].step_index)
        steps = [(rows[i].prompt_ids, rows[i].response_ids) for i in indices]
        contiguous = [rows[i].step_index for i in indices] == list(range(len(indices)))
        nested = is_append_only(steps) and _images_nest(rows, indices)
        nested = nested and len({rows[i].adapter for i in indices}) == 1  # one forward, one adapter
        if len(indices) > 1 and contiguous and nested:
            last = rows[indices[-1]]
            spans = [
                (i, len(rows[i].prompt_ids), len(rows[i].prompt_ids) + len(rows[i].response_ids))
                for i in indices
            ]
            sequences.append(TrainSequence(last.prompt_ids + last.response_ids, spans))
            packed += 1
        else:
            sequences.extend(_single(i, rows[i]) for i in indices)
    return sequences, packed


def _images_nest(rows: list[TrainRow], indices: list[int]) -> bool:
    """Whether each step's images start with the previous step's (then the last step's images
    are every packed step's: the sequence is one forward with them)."""
    return all(
        rows[b].images[: len(rows[a].images)] == rows[a].images
        for a, b in itertools.pairwise(indices)
    )


def sequence_images(sequences: list[TrainSequence], rows: list[TrainRow]) -> list[list]:
    """The images each sequence shows: its last step's (a packed sequence's steps nest)."""
    return [list(rows[seq.spans[-1][0]].images) for seq in sequences]


def episode_keys(rows: list[TrainRow]) -> list[str]:
    """Per row, its episode's key: the trajectory_id when that id's rows have step indexes
    0, 1, ..., k-1, else one of its own (an id shared by unrelated rows, or missing steps,
    must not make one huge "episode")."""
    by_traj: dict[str, list[int]] = {}
    for i, row in enumerate(rows):
        by_traj.setdefault(row.trajectory_id, []).append(i)
    keys = [""] * len(rows)
    for trajectory_id, members in by_traj.items():
        steps = sorted(rows[i].step_index for i in members)
        whole = bool(trajectory_id) and steps == list(range(len(members)))
        for i in members:
            keys[i] = trajectory_id if whole else f"\0{i}"
    return keys


def demonstration_episodes(rows: list[TrainRow]) -> list[list[TrainRow]]:
    """`rows` as episodes (`episode_keys`), each in step order."""
    episodes: dict[str, list[TrainRow]] = {}
    for row, key in zip(rows, episode_keys(rows), strict=True):
        episodes.setdefault(key, []).append(row)
    return [sorted(e, key=lambda r: r.step_index) for e in episodes.values()]


def _single(index: int, row: TrainRow) -> TrainSequence:
    start = len(row.prompt_ids)
    return TrainSequence(
        row.prompt_ids + row.response_ids, [(index, start, start + len(row.response_ids))]
    )


@dataclass
class MicroBatch:
    """Tensors of one micro-batch. B sequences of padded length L; N response tokens; S steps.

    input_ids, position_ids: [B, L]; attention_mask: [B, L] (left-padded) or, for a prefix
    tree, a boolean [1, 1, L, L] (position i attends to j when j is i or one of its ancestors).
    token_pos: [N, 2] (sequence, position) whose logits predict response token `targets` [N];
    token_step: [N] the step (0..S-1) each token belongs to; old_logprobs, token_weights: [N]
    (`TrainRow.token_weights`, 1 where a row has none).
    value_pos: [S, 2] each step's last prompt token; advantages, returns, old_values: [S];
    traj_tokens: [S] the response tokens of each step's trajectory (`TrainRow.trajectory_tokens`).
    vision: a VLM's image inputs for the B sequences (`prompting.vision`); empty for text.
    role, adapter: the role whose rows these are and the adapter its forward runs (a team's).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    token_pos: torch.Tensor
    targets: torch.Tensor
    token_step: torch.Tensor
    old_logprobs: torch.Tensor
    token_weights: torch.Tensor
    value_pos: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor
    old_values: torch.Tensor
    traj_tokens: torch.Tensor
    vision: dict[str, torch.Tensor] = field(default_factory=dict)
    role: str | None = None
    adapter: str | None = None

    @property
    def response_tokens(self) -> int:
        return int(self.targets.numel())

    @property
    def steps(self) -> int:
        return int(self.advantages.numel())

    def to(self, device: torch.device | str) -> MicroBatch:
        kept = ("vision", "role", "adapter")
        moved = {k: v.to(device) for k, v in vars(self).items() if k not in kept}
        vision = {k: v.to(device) for k, v in self.vision.items()}
        return MicroBatch(**moved, vision=vision, role=self.role, adapter=self.adapter)


def collate(sequences: list[TrainSequence], rows: list[TrainRow], pad_id: int) -> MicroBatch:
    """Left-pad `sequences` and flatten their response tokens and steps."""
    width = max(len(s.input_ids) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(sequences), width), dtype=torch.long)
    offsets = [width - len(seq.input_ids) for seq in sequences]
    for b, seq in enumerate(sequences):
        ids[b, offsets[b] :] = torch.tensor(seq.input_ids, dtype=torch.long)
        attn[b, offsets[b] :] = 1
    return _micro_batch(
        sequences,
        rows,
        lambda b, t: (b, offsets[b] + t),
        ids,
        attn,
        (attn.cumsum(-1) - 1).clamp(min=0),
    )


def _digest(image) -> int:
    """A picture's identity as a negative number (never a token id): 64 bits of its pixels'
    BLAKE2b digest, with its size and mode."""
    data = f"{image.mode}{image.size}".encode() + image.tobytes()
    return -1 - int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def tree_keys(
    sequences: list[TrainSequence], images: list[list] | None, image_token: int | None
) -> list[list[int]]:
    """What a prefix tree merges on: each sequence's token ids, where a VLM's image token
    (`image_token`, `images[i]` the pictures sequence i shows, in prompt order) is its
    picture's digest instead. Every picture is the same number of image tokens (a
    fixed-resolution, LLaVA-style processor), so image token k of a sequence stands for
    picture k // (its image tokens / its pictures)."""
    if image_token is None or images is None:
        return [seq.input_ids for seq in sequences]
    keys = []
    for seq, shown in zip(sequences, images, strict=True):
        at = [t for t, token in enumerate(seq.input_ids) if token == image_token]
        if len(at) % max(1, len(shown)) or bool(at) != bool(shown):
            raise ValueError(
                f"a prompt shows {len(shown)} image(s) in {len(at)} image tokens: a prefix tree "
                "needs the same number of tokens per image (set trainer.shared_prefix=false)"
            )
        ids, per = list(seq.input_ids), len(at) // max(1, len(shown))
        digests = [_digest(image) for image in shown]
        for k, t in enumerate(at):
            ids[t] = digests[k // per]
        keys.append(ids)
    return keys


def collate_tree(
    sequences: list[TrainSequence], rows: list[TrainRow], keys: list[list[int]] | None = None
) -> tuple[MicroBatch, list]:
    """`sequences` merged into one prefix tree (a trie over their `tree_keys`, by default
    their token ids): a [1, T] batch where T is the number of distinct prefixes, with a tree
    attention mask and each position's depth as its position id. Also returns the pictures
    the tree's image tokens stand for, in tree order (each once; `keys` from `tree_keys`)."""
    keys = keys if keys is not None else [seq.input_ids for seq in sequences]
    shown = sequence_images(sequences, rows)
    children: list[dict[int, int]] = [{}]  # node 0 is the empty prefix
    parents, tokens, depths, pictures = [-1], [0], [-1], []
    paths = []
    for b, seq in enumerate(sequences):
        per = sum(key < 0 for key in keys[b]) // max(1, len(shown[b]))  # tokens per picture
        node, path, seen = 0, [], 0  # seen: the image tokens before this one
        for depth, (token, key) in enumerate(zip(seq.input_ids, keys[b], strict=True)):
            child = children[node].get(key)
            if child is None:
                child = len(tokens)
                children[node][key] = child
                children.append({})
                parents.append(node)
                tokens.append(token)
                depths.append(depth)
                if key < 0 and seen % per == 0:  # a picture's first token, new to the tree
                    pictures.append(shown[b][seen // per])
            seen += key < 0
            node = child
            path.append(child - 1)  # tree position, without the empty prefix
        paths.append(path)
    size = len(tokens) - 1
    mask = np.zeros((size, size), dtype=bool)
    for node in range(1, size + 1):  # parents come before children: copy the parent's row
        if parents[node] > 0:
            mask[node - 1] = mask[parents[node] - 1]
        mask[node - 1, node - 1] = True
    batch = _micro_batch(
        sequences,
        rows,
        lambda b, t: (0, paths[b][t]),
        torch.tensor([tokens[1:]], dtype=torch.long),
        torch.from_numpy(mask)[None, None],
        torch.tensor([depths[1:]], dtype=torch.long),
    )
    return batch, pictures


def _micro_batch(
    sequences: list[TrainSequence],
    rows: list[TrainRow],
    where: Callable[[int, int], tuple[int, int]],
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
) -> MicroBatch:
    """The response tokens and steps of `sequences` laid out in `input_ids`, where token t of
    sequence b sits at `where(b, t)` = (batch row, position)."""
    token_pos, token_step, targets, old, weights = [], [], [], [], []
    value_pos, step_rows = [], []
    for b, seq in enumerate(sequences):
        for row_index, start, stop in seq.spans:
            step = len(step_rows)
            step_rows.append(rows[row_index])
            value_pos.append(where(b, start - 1))
            for t in range(start, stop):
                token_pos.append(where(b, t - 1))  # logits at t - 1 predict token t
                token_step.append(step)
                targets.append(seq.input_ids[t])
            old.extend(rows[row_index].old_logprobs)
            weights.extend(rows[row_index].token_weights or [1.0] * (stop - start))

    def floats(values: list[float]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.float32)

    return MicroBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        token_pos=torch.tensor(token_pos, dtype=torch.long).reshape(-1, 2),
        targets=torch.tensor(targets, dtype=torch.long),
        token_step=torch.tensor(token_step, dtype=torch.long),
        old_logprobs=floats(old),
        token_weights=floats(weights),
        value_pos=torch.tensor(value_pos, dtype=torch.long).reshape(-1, 2),
        advantages=floats([r.advantage for r in step_rows]),
        returns=floats([r.return_ for r in step_rows]),
        old_values=floats([r.value for r in step_rows]),
        traj_tokens=floats([_trajectory_tokens(r) for r in step_rows]),
    )


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def tree_microbatches(
    sequences: list[list[int]], indices: list[int], max_sequences: int, token_budget: int
) -> list[list[int]]:
    """Split `indices` (into `sequences`' token lists) into prefix-tree micro-batches: in
    lexicographic order (neighbours share the longest prefixes), each micro-batch taking
    sequences while its tree stays within `token_budget` positions and `max_sequences`
    sequences. In sorted order a sequence adds len - (common prefix with the one before)
    positions to the tree; a sequence longer than the budget gets a micro-batch of its own."""
    order = sorted(indices, key=lambda i: sequences[i])
    micros: list[list[int]] = []
    size = 0
    for i in order:
        if micros and len(micros[-1]) < max_sequences:
            shared = _common_prefix(sequences[micros[-1][-1]], sequences[i])
            grown = size + len(sequences[i]) - shared
            if grown <= token_budget:
                micros[-1].append(i)
                size = grown
                continue
        micros.append([i])
        size = len(sequences[i])
    return micros


def _row_minibatches(order: list[int], counts: Sequence[int], size: int) -> list[list[int]]:
    """Sequences in `order` cut into mini-batches of at least `size` step rows (the last may
    hold fewer)."""
    minis: list[list[int]] = []
    held = size
    for i in order:
        if held >= size:
            minis.append([])
            held = 0
        minis[-1].append(i)
        held += counts[i]
    return minis


def _group_minibatches(
    keys: Sequence[str], counts: Sequence[int], n: int, rng: np.random.Generator
) -> list[list[int]]:
    """Sequences grouped by `keys`; the groups, in shuffled order, dealt into `n` mini-batches,
    each to the one holding the fewest step rows so far (the first n one each)."""
    members: dict[str, list[int]] = {}
    for i, key in enumerate(keys):
        members.setdefault(key, []).append(i)
    names = list(members)
    minis: list[list[int]] = [[] for _ in range(min(n, len(names)))]
    held = [0] * len(minis)
    for g in rng.permutation(len(names)).tolist():
        lightest = held.index(min(held))
        minis[lightest].extend(members[names[g]])
        held[lightest] += sum(counts[i] for i in members[names[g]])
    return minis


def sequence_role(sequence: TrainSequence, rows: list[TrainRow]) -> str | None:
    """The role of a sequence's rows (a packed trajectory's rows share their role)."""
    return rows[sequence.spans[0][0]].role


def split_by_role(micros: list[list[int]], roles: Sequence[str | None]) -> list[list[int]]:
    """Micro-batches of sequence indices, each split so that it holds one role's sequences
    (`roles[i]`: sequence i's role), the parts in the order their roles first appear."""
    out = []
    for micro in micros:
        parts: dict[str | None, list[int]] = {}
        for i in micro:
            parts.setdefault(roles[i], []).append(i)
        out.extend(parts.values())
    return out


def plan_minibatches(
    sequences: list[list[int]],
    mini_batch_size: int,
    micro_batch_size: int,
    seed: int,
    tree_tokens: int | None = None,
    step_rows: Sequence[int] | None = None,
    groups: Sequence[str] | None = None,
    mini_batches: int | None = None,
    episodes: Sequence[str] | None = None,
) -> list[list[list[int]]]:
    """Shuffle sequence indices into mini-batches of `mini_batch_size` step rows, then split
    each into micro-batches: of sequences of similar length (less padding), or with
    `tree_tokens` into prefix trees of at most that many positions (`tree_microbatches`).
    `step_rows[i]` is how many step rows sequence i holds (1 each when not given; a packed
    trajectory holds all its steps): a mini-batch takes whole sequences in shuffled order
    until it holds at least `mini_batch_size` rows, so packing changes the optimizer steps
    per epoch only by the rows of the last trajectory a mini-batch takes, not by the
    trajectories' length. With `mini_batches` (and `groups[i]`, sequence i's group), there
    are that many mini-batches of whole groups (`_group_minibatches`), fewer when there are
    fewer groups or when mini-batches of `mini_batch_size` rows would be fewer. Without
    `mini_batches`, `episodes[i]` (sequence i's episode) keeps an episode's sequences together:
    whole episodes in shuffled order, as a packed trajectory is one sequence.
    Returns [mini][micro] -> sequence indices."""
    rng = np.random.default_rng(seed)
    counts = step_rows if step_rows is not None else [1] * len(sequences)
    if mini_batches is None:
        units: dict[str, list[int]] = {}
        for i in range(len(sequences)):
            units.setdefault(episodes[i] if episodes is not None else str(i), []).append(i)
        members = list(units.values())
        held = [sum(counts[i] for i in m) for m in members]
        order = rng.permutation(len(members)).tolist()
        minis = [
            [i for u in mini for i in members[u]]
            for mini in _row_minibatches(order, held, mini_batch_size)
        ]
    else:
        keys = groups if groups is not None else [str(i) for i in range(len(sequences))]
        count = min(mini_batches, -(-sum(counts) // mini_batch_size))
        minis = _group_minibatches(keys, counts, count, rng)
    plan = []
    for mini in minis:
        if tree_tokens is not None:
            plan.append(tree_microbatches(sequences, mini, micro_batch_size, tree_tokens))
            continue
        mini.sort(key=lambda i: len(sequences[i]))
        plan.append([mini[j : j + micro_batch_size] for j in range(0, len(mini), micro_batch_size)])
    return plan
