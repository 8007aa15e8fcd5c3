"""`TrainerGroup`: a multi-rank DeepSpeed update as N Ray actors in one torch.distributed
group (gloo on CPU, NCCL on GPU), driven from the flow's process through the same methods as
an in-process `PolicyTrainer`. A dead or silent rank fails the call, naming it, and stops the
group so no rank waits in a collective forever."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

from agent_core.trainer.policy_trainer import PolicyTrainer
from agent_core.workers.liveness import (
    CallTimeoutError,
    SilentActorError,
    actor_class,
    identity,
    ready_in_turn,
)
from agent_core.workers.ray_cluster import actor_options, ensure_ray, wait_started
from configs.run_config import RunConfig
from configs.trainer import TrainerSection

RERUN = "Rerun the run to resume from its last complete iteration."


def _last_line(exc: BaseException) -> str:
    """The innermost error of a (Ray-wrapped) exception: its traceback's last line."""
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else type(exc).__name__


DEATH_GRACE_S = 10.0


def _root_cause(refs: list, rank: int, exc: Exception, grace_s: float) -> tuple[int, BaseException]:
    """The rank to blame when `rank`'s call raised `exc`: a rank whose process died is the
    cause, and the others then fail in a collective ("Connection closed by peer"), often
    before Ray has noticed the death. So the other calls get `grace_s` to settle, and the
    first one that failed because its actor died is named; else `rank` itself."""
    import ray
    from ray.exceptions import RayActorError

    others = [r for i, r in enumerate(refs) if i != rank]
    if not others or isinstance(exc, RayActorError):
        return rank, exc
    ready, _ = ray.wait(others, num_returns=len(others), timeout=grace_s)
    for ref in sorted(ready, key=refs.index):
        try:
            ray.get(ref)
        except RayActorError as died:
            return refs.index(ref), died
        except Exception:
            continue
    return rank, exc


class TrainerRank:
    """One rank: the process-group variables DeepSpeed reads, then a `PolicyTrainer`."""

    def __init__(self, cwd: str, threads: int) -> None:
        os.chdir(cwd)
        if threads:
            import torch

            torch.set_num_threads(threads)
        self.trainer: Any = None

    def pid(self) -> int:
        """The rank's process id."""
        return os.getpid()

    def heartbeat(self) -> str:
        """Its pid and node; answered on a thread of its own while a call runs."""
        return identity()

    def address(self) -> tuple[str, int]:
        """This node's IP and a port free on it (rank 0 hosts the group's rendezvous)."""
        import ray

        with socket.socket() as sock:
            sock.bind(("", 0))
            return ray.util.get_node_ip_address(), sock.getsockname()[1]

    def build(self, rank: int, world: int, master: tuple[str, int], args: dict) -> int:
        """Join the group as `rank` of `world` and build the trainer (restoring DeepSpeed
        state from the weights folder when it holds some). Returns the process id."""

        os.environ.update(
            RANK=str(rank),
            LOCAL_RANK=str(args.pop("local_rank")),
            WORLD_SIZE=str(world),
            MASTER_ADDR=master[0],
            MASTER_PORT=str(master[1]),
        )
        cfg = TrainerSection.model_validate(args.pop("trainer"))
        weights = Path(args.pop("weights"))
        self.trainer = PolicyTrainer(weights, cfg, **args)
        self.trainer.load_state(weights)
        return os.getpid()

    def call(self, method: str, *args: Any) -> Any:
        """Run a `PolicyTrainer` method on this rank."""
        return getattr(self.trainer, method)(*args)

    def put_weights(self) -> list:
        """Put the gathered LM weights into the object store (rank 0 holds them; under ZeRO-3
        every rank takes part in the gather). Returns [ref] on rank 0, [] elsewhere."""
        import ray

        state = self.trainer.lm_state_dict()
        return [ray.put(state)] if self.trainer.rank == 0 else []


class TrainerGroup:
    """`trainer.ranks` ranks behaving as one `PolicyTrainer`: each method runs on every rank;
    rank 0's answer is returned."""

    def __init__(
        self, cfg: RunConfig, weights: Path, temperature: float, seed: int, reference
    ) -> None:
        from transformers import AutoTokenizer

        ensure_ray(cfg)
        self.cfg = cfg
        t = cfg.trainer
        remote = actor_class(TrainerRank)
        options = actor_options(t.rank_cpus, t.rank_gpus, cfg.rollout.threads or 1)
        self.ranks = [remote.options(**options).remote(os.getcwd(), 1) for _ in range(t.ranks)]
        self.tokenizer = AutoTokenizer.from_pretrained(weights, trust_remote_code=False)
        wait_started(self.ranks, cfg, "trainer ranks", t.rank_cpus, t.rank_gpus)
        start = cfg.ray.start_timeout_s
        master = self._gather([self.ranks[0].address.remote()], "start", start)
        args = {
            "trainer": t.model_dump(mode="json"),
            "weights": str(weights),
            "temperature": temperature,
            "seed": seed,
            "reference_path": str(reference) if reference else None,
        }
        builds = [
            r.build.remote(i, t.ranks, master, args | {"local_rank": self._local_rank(i)})
            for i, r in enumerate(self.ranks)
        ]
        self._gather(builds, "start", start)

    def _local_rank(self, rank: int) -> int:
        # one rank per GPU on a node: Ray sets CUDA_VISIBLE_DEVICES per actor, so device 0
        return 0 if self.cfg.trainer.rank_gpus else rank

    def _gather(self, refs: list, what: str, timeout: float | None = None) -> Any:
        """Rank 0's result of one call on every rank, once every rank has finished (only rank
        0's is fetched: the others' copies of the weights stay where they are). A rank that
        died, raised, stopped answering heartbeats (`ray.heartbeat_timeout_s`) or has not
        finished within `timeout` (default `ray.update_timeout_s`) fails the call naming it;
        the group is then stopped (its other ranks may be blocked in a collective)."""
        import ray

        try:
            self._wait(refs, what, self.cfg.ray.update_timeout_s if timeout is None else timeout)
        except BaseException:
            self.stop()
            raise
        return ray.get(refs[0])

    def _wait(self, refs: list, what: str, timeout: float) -> None:
        """Every rank's call has finished; else an error naming the rank that failed first."""
        import ray

        n, beat = len(self.ranks), self.cfg.ray.heartbeat_timeout_s
        try:
            # the ranks are up (wait_started): their first heartbeat is due at once
            for rank in ready_in_turn(refs, self.ranks[: len(refs)], timeout, beat, beat):
                try:
                    ray.get(refs[rank])
                except Exception as exc:
                    rank, exc = _root_cause(refs, rank, exc, min(beat, DEATH_GRACE_S))
                    raise RuntimeError(
                        f"trainer rank {rank} of {n} failed during {what}: {_last_line(exc)}; "
                        f"all ranks were stopped. {RERUN}"
                    ) from exc
        except SilentActorError as exc:
            raise TimeoutError(
                f"trainer rank {exc.index} of {n} stalled during {what}: {exc}; all ranks were "
                f"stopped. {RERUN}"
            ) from exc
        except CallTimeoutError as exc:
            raise TimeoutError(
                f"trainer rank(s) {exc.pending} of {n} did not finish {what} within "
                f"{timeout:g} s (ray.update_timeout_s / ray.start_timeout_s): all ranks "
                f"were stopped. {RERUN}"
            ) from exc

    def _all(self, method: str, *args: Any) -> Any:
        import ray

        shared = [ray.put(a) if isinstance(a, list) else a for a in args]  # rows: put once
        return self._gather([r.call.remote(method, *shared) for r in self.ranks], method)

    def update(self, rows, iteration: int, epochs: int | None = None, demonstrations=None):
        """One update over `rows`, each rank training on its share of every mini-batch (and of
        every step's draw of `demonstrations`)."""
        return self._all("update", rows, iteration, epochs, demonstrations)

    def sft_update(self, rows, epochs: int, learning_rate: float, only: tuple[str, ...] = ()):
        """Supervised warm-up on demonstration rows, split over the ranks like `update`."""
        return self._all("sft_update", rows, epochs, learning_rate, only)

    def step_values(self, rows) -> list[float]:
        """The value head's estimates (every rank computes all rows: ZeRO-3 needs all)."""
        return self._all("step_values", rows)

    def log_ratios(self, rows) -> list[float]:
        """Per-row log-prob ratio new/old, as `PolicyTrainer.log_ratios`."""
        return self._all("log_ratios", rows)

    def reference_kl(self, rows) -> list[float]:
        """Per-step KL to the reference, as `PolicyTrainer.reference_kl`."""
        return self._all("reference_kl", rows)

    def save(self, checkpoint_dir: Path, metadata: dict, on_half_written=None) -> Path:
        """Every rank saves: rank 0 the HF folder, each its DeepSpeed partition. The
        half-written hook runs in rank 0 (a fault injected there kills that rank)."""
        del on_half_written  # the ranks reach their own crash points (agent_core.core.faults)
        self._all("save", Path(checkpoint_dir), metadata)
        return Path(checkpoint_dir)

    def lm_state_dict(self) -> dict:
        """Rank 0's gathered LM weights, fetched into this process."""
        return self._all("lm_state_dict")

    def weights_ref(self) -> Any:
        """An object-store reference to the gathered LM weights (for rollout workers)."""
        refs = [r.put_weights.remote() for r in self.ranks]
        return self._gather(refs, "weight sync")[0]

    def stop(self) -> None:
        """Kill every rank (frees their processes; a blocked collective ends with them)."""
        import ray

        for rank in self.ranks:
            ray.kill(rank, no_restart=True)
        self.ranks = []
