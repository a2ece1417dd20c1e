"""A bounded random-fault soak of lightning-run (CTest: launcher.fault_soak_leaves_nothing_behind).

Each trial starts lightning-run with 4 shell workers; each worker starts a child, which starts a
grandchild. One fault is drawn (fixed seed): a worker killed with SIGKILL or SIGSEGV, a worker
exiting with a code, SIGTERM, SIGINT, SIGKILL or SIGSEGV to the launcher, or none. The trial checks the
launcher's exit code against the fault, that it ended (a hang is a trial that runs past its
limit), and that every process of the job is gone within 2 s of the launcher's end: processes are
found by a marker in their environment, so nothing escapes the count. Prints the three counts;
each must be 0.
Usage: fault_soak.py LIGHTNING_RUN [TRIALS] [SEED]
"""
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

WORKER = r"""#!/bin/bash
# A worker with a child and a grandchild; the fault, if it is this rank's, after a delay.
(sleep 60 & sleep 60; wait) &
touch "$SOAK_DIR/up.$RANK"
if [[ "$SOAK_RANK" == "$RANK" ]]; then
  sleep "$SOAK_DELAY"
  case "$SOAK_FAULT" in
    kill9) kill -9 $$ ;;
    segv) kill -SEGV $$ ;;
    exit) exit "$SOAK_CODE" ;;
  esac
fi
sleep "$SOAK_DURATION"
exit 0
"""

FAULTS = ["none", "kill9", "segv", "exit", "launcher_term", "launcher_int", "launcher_kill", "launcher_segv"]
LAUNCHER_SIGNALS = {"launcher_term": signal.SIGTERM, "launcher_int": signal.SIGINT, "launcher_kill": signal.SIGKILL,
                    "launcher_segv": signal.SIGSEGV}


def job_processes(marker):
    """Pids whose environment holds the trial's marker."""
    found = []
    needle = marker.encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as env:
                if needle in env.read():
                    found.append(int(entry))
        except OSError:
            pass
    return found


def expected_code(fault, code):
    return {"none": 0, "kill9": 137, "segv": 139, "exit": code, "launcher_term": 143,
            "launcher_int": 130, "launcher_kill": -signal.SIGKILL, "launcher_segv": -signal.SIGSEGV}[fault]


def main():
    launcher = sys.argv[1]
    trials = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    rng = random.Random(int(sys.argv[3]) if len(sys.argv) > 3 else 1234)
    folder = tempfile.mkdtemp(prefix="lf-soak-")
    worker = os.path.join(folder, "worker.sh")
    with open(worker, "w") as out:
        out.write(WORKER)
    os.chmod(worker, 0o755)
    hangs = wrong_codes = left_behind = 0
    for trial in range(trials):
        fault = rng.choice(FAULTS)
        code = rng.choice([1, 3, 42])
        delay = round(rng.uniform(0.05, 0.8), 2)
        marker = f"LF_SOAK_MARK=soak-{os.getpid()}-{trial}"
        trial_dir = os.path.join(folder, f"trial{trial}")
        os.makedirs(trial_dir)
        env = dict(os.environ, LF_SOAK_MARK=marker.split("=", 1)[1], SOAK_FAULT=fault, SOAK_RANK=str(rng.randrange(4)),
                   SOAK_DIR=trial_dir,
                   SOAK_DELAY=str(delay), SOAK_CODE=str(code), SOAK_DURATION="3.0" if fault.startswith("launcher_") else "1.0")
        launcher_process = subprocess.Popen([launcher, "model", "--devices", "4", "--shutdown-grace", "1", worker],
                                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if fault in ("launcher_kill", "launcher_segv"):
            # No waiting for the job: a delay of 0.05-0.8 s kills the launcher anywhere from its own
            # start through spawning the workers to a running job, and nothing may survive it.
            time.sleep(delay)
        elif fault.startswith("launcher_"):
            # TERM/INT must reach a launcher that handles them (143/130); a slow start (sanitizers)
            # must not turn this into a signal that lands before main() runs.
            up_deadline = time.monotonic() + 20
            while len([f for f in os.listdir(trial_dir) if f.startswith("up.")]) < 4 and time.monotonic() < up_deadline:
                time.sleep(0.01)
            time.sleep(delay)
        if fault.startswith("launcher_"):
            launcher_process.send_signal(LAUNCHER_SIGNALS[fault])
        try:
            result = launcher_process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            hangs += 1
            launcher_process.kill()
            result = launcher_process.wait()
        deadline = time.monotonic() + 2.0
        remaining = job_processes(marker)
        while remaining and time.monotonic() < deadline:
            time.sleep(0.05)
            remaining = job_processes(marker)
        if remaining:
            left_behind += 1
            for pid in remaining:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        verdict = "ok"
        if result != expected_code(fault, code):
            wrong_codes += 1
            verdict = f"WRONG CODE (expected {expected_code(fault, code)})"
        if remaining:
            verdict += f" LEFT BEHIND {len(remaining)}"
        print(f"trial {trial:2d}: {fault:13s} delay {delay:.2f}s -> exit {result}: {verdict}", flush=True)
    print(f"hangs={hangs} wrong_exit_codes={wrong_codes} trials_with_processes_left_behind={left_behind}")
    if hangs or wrong_codes or left_behind:
        print("FAIL: the soak found faults")
        return 1
    print("soak passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
