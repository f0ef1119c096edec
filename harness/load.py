"""A bounded load generator for the real vLLM: N concurrent clients sending completions.

Used by the integration tests, the benchmark and to record the demo capture. It talks only to
the loopback vLLM the tests started, stops after `seconds`, and returns what it did.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from dataclasses import dataclass

import aiohttp


@dataclass(frozen=True)
class Phase:
    """A stretch of constant load: `clients` concurrent clients (0: none) for `seconds`."""

    name: str
    seconds: float
    clients: int = 0
    prompt_words: int = 50
    max_tokens: int = 100


@dataclass
class LoadResult:
    completed: int = 0
    failed: int = 0
    generated_tokens: int = 0


def prompt(words: int, rng: random.Random) -> str:
    return " ".join(f"w{rng.randrange(1000)}" for _ in range(words))


async def run_load(
    base_url: str,
    model: str,
    clients: int,
    seconds: float,
    prompt_words: int = 200,
    max_tokens: int = 300,
    stop: asyncio.Event | None = None,
    seed: int = 0,
) -> LoadResult:
    result = LoadResult()
    deadline = time.monotonic() + seconds
    stop = stop or asyncio.Event()
    timeout = aiohttp.ClientTimeout(total=max(30.0, seconds + 60))

    async def client(index: int, session: aiohttp.ClientSession) -> None:
        rng = random.Random(seed * 1000 + index)
        while time.monotonic() < deadline and not stop.is_set():
            body = {
                "model": model,
                "prompt": prompt(prompt_words, rng),
                "max_tokens": max_tokens,
                "ignore_eos": True,
                "temperature": 1.0,
            }
            try:
                async with session.post(f"{base_url}/v1/completions", json=body) as response:
                    payload = await response.json()
                    if response.status == 200:
                        result.completed += 1
                        result.generated_tokens += int(payload["usage"]["completion_tokens"])
                    else:
                        result.failed += 1
            except (aiohttp.ClientError, asyncio.TimeoutError):
                result.failed += 1
                await asyncio.sleep(0.5)

    async with aiohttp.ClientSession(timeout=timeout) as session:
        await asyncio.gather(*(client(i, session) for i in range(clients)))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--prompt-words", type=int, default=200)
    parser.add_argument("--max-tokens", type=int, default=300)
    args = parser.parse_args()
    result = asyncio.run(run_load(args.url, args.model, args.clients, args.seconds, args.prompt_words, args.max_tokens))
    print(result)


if __name__ == "__main__":
    main()
