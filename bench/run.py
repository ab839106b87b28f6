"""Run every benchmark in this folder (``make bench``); each prints its own figures."""

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: Runtime benchmarks (they start processes and train; minutes each on 2 cores).
RUNTIME = (
    "runtime_vs_torch.py",
    "runtime_fidelity.py",
    "schedules_fidelity.py",
    "multihost_fidelity.py",
    "runtime_gpu.py",
    "demo_fidelity.py",
)


def main() -> int:
    failed = []
    for script in [*sorted(HERE.glob("bench_*.py")), *(HERE / name for name in RUNTIME)]:
        print(f"\n=== {script.name} ===", flush=True)
        if subprocess.run([sys.executable, str(script)]).returncode:
            failed.append(script.name)
    if failed:
        print(f"\nfailed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
