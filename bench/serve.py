"""The policy server's overhead: requests/s and tokens/s at 1, 8 and 32 concurrent clients
(the official openai client, one thread each, chat requests) vs the engine called directly on
the same prompts in batches of the same size; the ratio is what HTTP, JSON, rendering and the
batching window cost. Run: .venv/bin/python bench/serve.py [--model DIR] [--clients 1,8,32]
(default model: SmolLM2-135M after `make setup-model`); --smoke: the tiny random model.
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ThreadPoolExecutor

from offline import DEFAULT_MODEL, SMOKE_HELP, prepare


def chats(count: int) -> list[list[dict[str, str]]]:
    """Distinct small chat requests (as an agent's first call would look)."""
    return [
        [{"role": "system", "content": "You are a careful assistant."},
         {"role": "user", "content": f"What is {7 * i + 3} plus {11 * i + 5}? Think briefly."}]
        for i in range(count)
    ]  # fmt: skip


def engine_direct(engine, prompts: list[list[int]], clients: int, max_tokens: int) -> tuple:
    """(seconds, generated tokens): the prompts in batches of `clients`, one generate each."""
    from agent_core.rollout.engine import SamplingParams

    params = SamplingParams(max_new_tokens=max_tokens, temperature=1.0, seed=1)
    start, tokens = time.perf_counter(), 0
    for at in range(0, len(prompts), clients):
        tokens += sum(len(g.token_ids) for g in engine.generate(prompts[at : at + clients], params))
    return time.perf_counter() - start, tokens


def through_server(base_url: str, messages: list, clients: int, max_tokens: int) -> tuple:
    """(seconds, generated tokens): `clients` threads, each sending its share sequentially."""
    import openai

    api = openai.OpenAI(base_url=f"{base_url}/v1", api_key="bench", max_retries=0, timeout=600)

    def client(index: int) -> int:
        done = 0
        for chat in messages[index::clients]:
            reply = api.chat.completions.create(
                model="policy", messages=chat, max_tokens=max_tokens, temperature=1.0
            )
            done += reply.usage.completion_tokens
        return done

    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        tokens = sum(pool.map(client, range(clients)))
    return time.perf_counter() - start, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", type=lambda s: __import__("pathlib").Path(s),
                        default=DEFAULT_MODEL)  # fmt: skip
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--clients", default="1,8,32", help="Concurrent client counts.")
    parser.add_argument("--requests", type=int, default=2, help="Requests per client.")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--window-s", type=float, default=0.01, help="Batching window.")
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args()
    if args.smoke:
        args.clients, args.requests, args.max_tokens = "1,4", 2, 8
    if not prepare(args):
        return
    from agent_core.core.records import Observation
    from agent_core.prompting.renderer import PromptRenderer
    from agent_core.rollout.engines.hf import HFRolloutEngine
    from agent_core.serving.policy_server import ServerThread, build_app
    from agent_core.serving.service import PolicyService, ServerSettings

    engine = HFRolloutEngine(args.model, threads=args.threads)
    flow = PromptRenderer(engine.tokenizer)
    settings = ServerSettings(batch_window_s=args.window_s, max_batch=256)
    service = PolicyService(engine, engine.tokenizer, settings)
    print(f"model {args.model.name}, {args.requests} requests per client, "
          f"max_tokens {args.max_tokens}, window {args.window_s} s")  # fmt: skip
    # both sides are this one engine: same dtype and threads by construction
    import torch

    threads = args.threads or torch.get_num_threads()
    print(f"engine and server: {engine.model.dtype}, {threads} torch threads")
    print(f"{'clients':>7} {'engine req/s':>12} {'server req/s':>12} {'engine tok/s':>12} "
          f"{'server tok/s':>12} {'server/engine':>13} {'engine calls':>12}")  # fmt: skip
    with ServerThread(build_app(service)) as server:
        # warm-up of both paths at the measured budget (first calls, imports, allocations)
        engine_direct(engine, [flow.encode(Observation(chats(1)[0]))], 1, args.max_tokens)
        through_server(server.base_url, chats(1), 1, args.max_tokens)
        for clients in (int(c) for c in args.clients.split(",")):
            messages = chats(clients * args.requests)
            prompts = [flow.encode(Observation(m)) for m in messages]
            e_s, e_tok = engine_direct(engine, prompts, clients, args.max_tokens)
            before = service.batcher.calls
            s_s, s_tok = through_server(server.base_url, messages, clients, args.max_tokens)
            n = len(messages)
            print(f"{clients:>7} {n / e_s:>12.2f} {n / s_s:>12.2f} {e_tok / e_s:>12.1f} "
                  f"{s_tok / s_s:>12.1f} {(s_tok / s_s) / (e_tok / e_s):>13.2f} "
                  f"{service.batcher.calls - before:>12}")  # fmt: skip
    print("server/engine = server tokens/s over direct-engine tokens/s (1.0 = no overhead)")


if __name__ == "__main__":
    main()
