// The fork pattern: prepare a sandbox once, checkpoint it warm, and start many workers
// from that point, each independent. Run it with a daemon up (`sandfork serve`):
//   npx tsc -p tsconfig.test.json && node build/examples/fork.js

import { Sandbox } from "../src/index.js";

async function main(): Promise<void> {
  const parent = await Sandbox.create({ image: "python", memoryMb: 512 });
  try {
    // The slow setup, paid once: here a dataset built in a live Python process.
    await parent.files.write("/work/worker.py", WORKER);
    const server = await parent.startProcess("python3", ["/work/worker.py"], { name: "worker" });
    await parent.run("sh", ["-c", "until [ -e /tmp/ready ]; do sleep 0.1; done"]);

    // Disk, memory and the running process, checkpointed; then 8 forks from it.
    const snapshot = await parent.checkpoint({ type: "memory" });
    const workers = await snapshot.fork(8, { perChild: Array.from({ length: 8 }, (_, i) => ({ env: { SHARD: String(i) } })) });
    try {
      const answers = await Promise.all(
        workers.sandboxes.map(async (w) => (await w.run("sh", ["-c", "echo $SHARD; cat /tmp/ready"])).stdout.trim().replace("\n", ": ")),
      );
      console.log(`forked ${workers.length} workers from ${snapshot.id} (process ${server.pid} running in each):`);
      for (const answer of answers) console.log("  shard " + answer);
    } finally {
      await workers.terminateAll();
      await snapshot.delete();
    }
  } finally {
    await parent.terminate();
  }
}

const WORKER = `
import time
data = [i * i for i in range(2_000_000)]          # the expensive warm state
open("/tmp/ready", "w").write(f"{len(data)} items ready")
while True:
    time.sleep(1)
`;

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
