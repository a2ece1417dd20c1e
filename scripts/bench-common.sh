# Sourced by the benchmark scripts that compare against Python under torchrun: where the build,
# the project's Python and torchrun are, and a free port for torchrun (with 0 its workers are told
# port 0 and never meet). REPEATS (default 3) is how often each implementation runs.
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${BUILD_DIR:-$root/build}/bin"
python="${LF_PYTHON:-$root/.venv/bin/python}"
torchrun="$(dirname "$python")/torchrun"
free_port() { "$python" -c "import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); print(s.getsockname()[1])"; }
repeats="${REPEATS:-3}"
export OMP_NUM_THREADS=1
