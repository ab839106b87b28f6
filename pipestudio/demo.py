"""``make demo``: a guided tour of what PipeStudio does, on a real PipeDream profile.

It imports VGG-16's profile, describes a 4-device cluster, writes an equal-layer plan and
simulates it under each schedule, then writes a Chrome trace. Everything lands in
``.pipestudio/demo/``.
"""

import sys
from pathlib import Path

from pipestudio.cli import main as cli

ROOT = Path(__file__).resolve().parents[1]
PROFILES = ROOT / "profiles" / "pipedream"


def run(out_dir: Path) -> int:
    out_dir.mkdir(parents=True, exist_ok=True)
    graph = PROFILES / "vgg16" / "graph.txt"
    profile, cluster = out_dir / "vgg16.profile.json", out_dir / "cluster.json"
    steps = [
        ["import-pipedream", str(graph), "--batch-size", "128", "-o", str(profile)],
        ["cluster-template", "--devices", "4", "--bandwidth-gbps", "100",
         "--device-memory", "80GiB", "--host-bandwidth-gbps", "200", "-o", str(cluster)],
    ]
    for schedule in ("gpipe", "1f1b", "pipedream"):
        plan = out_dir / f"{schedule}.plan.json"
        steps.append(["plan-template", str(profile), "--stages", "4", "--microbatches", "8",
                      "--microbatch-size", "32", "--schedule", schedule, "-o", str(plan)])
        steps.append(["simulate", str(profile), str(plan), "--cluster", str(cluster),
                      "--trace", str(out_dir / f"{schedule}.trace.json")])
    for argv in steps:
        print(f"\n$ pipestudio {' '.join(argv)}", flush=True)
        status = cli(argv)
        if status:
            return status
    print(f"\nOpen the traces in {out_dir} with https://ui.perfetto.dev or chrome://tracing.")
    return 0


if __name__ == "__main__":
    sys.exit(run(ROOT / ".pipestudio" / "demo"))
