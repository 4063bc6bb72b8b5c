"""Run many scripts, each in a fresh sandbox, concurrently with asyncio.

    python3 async_fanout.py
"""

import asyncio

from sandfork import AsyncSandbox


async def run_one(i: int) -> str:
    async with await AsyncSandbox.create(memory_mb=128) as sb:
        r = await sb.run("sh", ["-c", f"echo job {i}: $(( {i} * {i} ))"])
        return r.stdout.strip()


async def main() -> None:
    for line in await asyncio.gather(*(run_one(i) for i in range(16))):
        print(line)


if __name__ == "__main__":
    asyncio.run(main())
