"""A bounded load generator for the real vLLM: N concurrent clients sending completions.

Used by the integration tests, the benchmark and to record the demo capture. It talks only to
the loopback vLLM the tests started, stops after `seconds`, and returns what it did. Streamed requests
(`stream`) measure the client's own time to first token; `run_load_processes` spreads many streaming clients
over processes of their own, so that the load's event loop is never what limits the server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field

import aiohttp


@dataclass(frozen=True)
class Phase:
    """A stretch of constant load: `clients` concurrent clients (0: none) for `seconds`."""

    name: str
    seconds: float
    clients: int = 0
    prompt_words: int = 50
    max_tokens: int = 100
    stream: bool = False  # one server-sent event per token (the API server's heaviest path)
    logprobs: int = 0  # top logprobs per token (heavier still)
    prompt_pool: int = 0  # every client draws its prompts from the same N prompts (0: each prompt new)


@dataclass
class LoadResult:
    completed: int = 0
    failed: int = 0
    generated_tokens: int = 0
    ttft_seconds: list[float] = field(default_factory=list, repr=False)  # streamed requests: first chunk after the send

    def merge(self, other: LoadResult) -> None:
        self.completed += other.completed
        self.failed += other.failed
        self.generated_tokens += other.generated_tokens
        self.ttft_seconds += other.ttft_seconds

    def __str__(self) -> str:
        text = f"completed={self.completed} failed={self.failed} generated_tokens={self.generated_tokens}"
        if len(self.ttft_seconds) >= 2:
            quantiles = statistics.quantiles(self.ttft_seconds, n=20)
            text += f" client_ttft_p50={statistics.median(self.ttft_seconds):.3f}s client_ttft_p95={quantiles[18]:.3f}s"
        return text


def prompt(words: int, rng: random.Random) -> str:
    return " ".join(f"w{rng.randrange(1000)}" for _ in range(words))


async def _streamed(response: aiohttp.ClientResponse, sent: float, result: LoadResult) -> int:
    """Reads the server-sent events to the end; the first one's arrival is the client's TTFT."""
    first, tokens = True, 0
    async for line in response.content:
        if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
            continue
        if first:
            result.ttft_seconds.append(time.monotonic() - sent)
            first = False
        tokens += 1
    return tokens


async def run_load(
    base_url: str,
    model: str,
    clients: int,
    seconds: float,
    prompt_words: int = 200,
    max_tokens: int = 300,
    stop: asyncio.Event | None = None,
    seed: int = 0,
    stream: bool = False,
    logprobs: int = 0,
    shared_prefix_words: int = 0,
    prompt_pool: int = 0,
) -> LoadResult:
    result = LoadResult()
    deadline = time.monotonic() + seconds
    stop = stop or asyncio.Event()
    timeout = aiohttp.ClientTimeout(total=max(30.0, seconds + 60))

    # the same words opening every prompt (a system prompt), then each prompt's own
    shared = prompt(shared_prefix_words, random.Random(-1)) + " " if shared_prefix_words else ""
    # returning prompts (a chat's history, a RAG corpus): the same N, each drawn at random by every client
    pool = [prompt(prompt_words, random.Random(-2 - i)) for i in range(prompt_pool)]

    async def client(index: int, session: aiohttp.ClientSession) -> None:
        rng = random.Random(seed * 1000 + index)
        while time.monotonic() < deadline and not stop.is_set():
            body: dict[str, object] = {
                "model": model,
                "prompt": shared + (rng.choice(pool) if pool else prompt(prompt_words, rng)),
                "max_tokens": max_tokens,
                "ignore_eos": True,
                "temperature": 1.0,
            }
            if stream:
                body["stream"] = True
            if logprobs:
                body["logprobs"] = logprobs
            try:
                sent = time.monotonic()
                async with session.post(f"{base_url}/v1/completions", json=body) as response:
                    if response.status != 200:
                        await response.read()
                        result.failed += 1
                    elif stream:
                        tokens = await _streamed(response, sent, result)  # not `+= await`: it would add to a stale total
                        result.generated_tokens += tokens
                        result.completed += 1
                    else:
                        payload = await response.json()
                        result.completed += 1
                        result.generated_tokens += int(payload["usage"]["completion_tokens"])
            except (aiohttp.ClientError, asyncio.TimeoutError):
                result.failed += 1
                await asyncio.sleep(0.5)

    async with aiohttp.ClientSession(timeout=timeout) as session:
        await asyncio.gather(*(client(i, session) for i in range(clients)))
    return result


async def run_load_processes(base_url: str, model: str, phase: Phase, processes: int) -> LoadResult:
    """The phase's clients split over `processes` load processes (this module's main), their results summed; keep
    each under aiohttp's 100 connections per session."""
    share = [phase.clients // processes + (i < phase.clients % processes) for i in range(processes)]
    children = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "harness.load",
            *("--url", base_url, "--model", model, "--clients", str(n), "--seconds", str(phase.seconds)),
            *("--prompt-words", str(phase.prompt_words), "--max-tokens", str(phase.max_tokens), "--seed", str(i), "--json"),
            *(("--stream",) if phase.stream else ()),
            *(("--logprobs", str(phase.logprobs)) if phase.logprobs else ()),
            *(("--prompt-pool", str(phase.prompt_pool)) if phase.prompt_pool else ()),
            stdout=asyncio.subprocess.PIPE,
        )
        for i, n in enumerate(share)
        if n
    ]
    result = LoadResult()
    for child in children:
        out, _ = await child.communicate()
        result.merge(LoadResult(**json.loads(out)))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--prompt-words", type=int, default=200)
    parser.add_argument("--max-tokens", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--logprobs", type=int, default=0)
    parser.add_argument("--shared-prefix-words", type=int, default=0, help="words every prompt opens with (a system prompt)")
    parser.add_argument("--prompt-pool", type=int, default=0, help="draw every prompt from this many (0: each prompt new)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON (run_load_processes reads it)")
    args = parser.parse_args()
    shape = {
        "seed": args.seed,
        "stream": args.stream,
        "logprobs": args.logprobs,
        "shared_prefix_words": args.shared_prefix_words,
        "prompt_pool": args.prompt_pool,
    }
    load = run_load(args.url, args.model, args.clients, args.seconds, args.prompt_words, args.max_tokens, **shape)
    result = asyncio.run(load)
    print(json.dumps(asdict(result)) if args.json else result)


if __name__ == "__main__":
    main()
