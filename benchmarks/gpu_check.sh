#!/usr/bin/env bash
# GPU readiness check (benchmarks/gpu_check.py): bash benchmarks/gpu_check.sh --out gpu_out [--data-dir D] [--dry-run]
r="$(cd "$(dirname "$0")/.." && pwd)"; exec "${PYTHON:-$([ -x "$r/.venv/bin/python" ] && echo "$r/.venv/bin/python" || echo python3)}" "$r/benchmarks/gpu_check.py" "$@"
