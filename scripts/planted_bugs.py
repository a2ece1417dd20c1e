#!/usr/bin/env python3
"""Plants one-line bugs, one at a time, in a scratch copy of the source tree, rebuilds, runs the
test that must catch each, and reports caught or missed (docs/testing.md, "Planted bugs"). On
demand, not in CI: the scratch build is cold the first time (about 10 minutes on 2 cores), then
each bug costs a rebuild of its unity batch, the relinks and its test.

    python3 scripts/planted_bugs.py [NAME...]     no name: every bug; --list: the table
Every test in the table must pass on the unchanged tree first. Exit status 0 when every planted
bug was caught, 1 otherwise (a change that no longer applies or compiles counts as not caught). PLANTED_DIR (default
/tmp/lf-planted) holds the scratch copy and its build."""
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRATCH = os.environ.get("PLANTED_DIR", "/tmp/lf-planted")

# name, file, the line's text as it is, the planted text, the test (ctest -R, anchored) that must fail.
BUGS = [
    ("ddp-buffers-not-broadcast", "lib/src/strategies/ddp.cpp",
     "if (!options_.broadcast_buffers || world_size() < 2) return;", "return;",
     "ddp.checks_on_2_ranks"),
    ("tensor-group-broadcast-skipped", "lib/src/strategies/model_parallel.cpp",
     "if (world_size() > 1) broadcast_module_from_rank_zero(*module, {}, &collective());", ";",
     "model_parallel.trains_like_one_process_on_mesh_1x2_gloo"),
    ("gradients-summed-not-averaged", "lib/src/internal/gradient_reducer.cpp",
     "bucket.flat.div_(world);", ";",
     "ddp.checks_on_2_ranks"),
    ("fused-adamw-skips-weight-decay", "lib/src/utilities/fused_step.cpp",
     "beta1, beta2,\n                          options.weight_decay(), options.eps(), options.amsgrad()",
     "beta1, beta2,\n                          0.0, options.eps(), options.amsgrad()",
     "unit.test_fused_step"),
    ("unset-model-check-skipped", "lib/src/fabric.cpp",
     "if (world_size() < 2 || !loss.defined() || !loss.grad_fn()) return;", "return;",
     "fsdp.FULL_SHARD_matches_the_full_batch_reference_on_2_ranks"),
    ("set-epoch-ignored", "lib/src/utilities/data.cpp",
     "epoch_ = next_epoch_->value();", ";",
     "unit.test_data"),
    ("flops-counted-again-under-autocast", "lib/src/utilities/throughput.cpp",
     "if (kind != Counted::None && t_counted_depth++ == 0)", "if (kind != Counted::None)",
     "unit.test_throughput"),
    ("sync-batch-norm-backward-local", "lib/src/sync_batch_norm.cpp",
     "group->all_reduce_(sums, ReduceOp::Sum);", ";",
     "ddp.sync_batch_norm_equals_one_process_batch_norm_on_2_ranks"),
    ("checkpointing-no-op-accepted", "lib/src/fabric.cpp",
     "if (!unverified_checkpointed_.empty()) refuse_checkpointing_that_did_nothing();", ";",
     "unit.test_activation_checkpoint"),
    ("summon-between-forward-and-backward", "lib/src/strategies/fsdp.cpp",
     "LF_CHECK(!released && !sharded->awaiting_backward, RuntimeError,", "LF_CHECK(!released, RuntimeError,",
     "fsdp.summon_full_parameters_refused_between_forward_and_backward_32-true"),
    ("backward-inputs-ignored", "lib/src/plugins/precision/precision.cpp",
     "if (!options.inputs.empty()) inputs = options.inputs;", ";",
     "research_loops.match_one_process_single_32-true"),
    ("ddp-fills-gradients-outside-inputs", "lib/src/internal/gradient_reducer.cpp",
     "if (excluded[index]) {", "if (false) {",
     "research_loops.match_one_process_ddp_32-true_on_2_ranks"),
    ("fsdp-frees-what-a-retained-graph-saved", "lib/src/strategies/fsdp.cpp",
     "if (frees_parameters() && !keep_full_) free_full_parameters(sharded, unit);",
     "if (frees_parameters()) free_full_parameters(sharded, unit);",
     "research_loops.match_one_process_fsdp_32-true_on_2_ranks"),
    ("grad-left-scaled-under-16-mixed", "lib/src/fabric.cpp",
     "if (grad.defined()) grad = grad / scale;", ";",
     "research_loops.match_one_process_single_bf16-mixed-scaled"),
    ("all-gather-drops-gradients", "lib/src/fabric.cpp",
     "return options.sync_grads ? GatherWithGradients::apply(tensor, group) : group->all_gather(tensor);",
     "return group->all_gather(tensor);",
     "research_loops.match_one_process_ddp_32-true_on_2_ranks"),
    ("fsdp-no-grad-forward-frees-saved-parameters", "lib/src/strategies/fsdp.cpp",
     "if (sharded.awaiting_backward) {", "if (false) {",
     "research_loops.match_one_process_fsdp_32-true_on_2_ranks"),
    ("pickle-build-not-in-place", "lib/src/checkpoint/pickle_tree.cpp",
     "NodePtr state = pop(), object = pop();\n        auto unbuilt",
     "NodePtr state = pop(), object = std::make_shared<Node>(*pop());\n        auto unbuilt",
     "unit.test_checkpoint_format"),
]


def run(command, **kwargs):
    return subprocess.run(command, cwd=kwargs.pop("cwd", SCRATCH), **kwargs)


def prepare():
    source = os.path.join(SCRATCH, "src")
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, check=True,
                           capture_output=True, text=True).stdout.split()
    for name in files:
        target = os.path.join(source, name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if not os.path.exists(target) or open(os.path.join(ROOT, name), "rb").read() != open(target, "rb").read():
            shutil.copy(os.path.join(ROOT, name), target)  # a new mtime: the scratch build must see the change
    venv = os.path.join(source, ".venv")
    if not os.path.exists(venv):
        os.symlink(os.path.join(ROOT, ".venv"), venv)
    env = dict(os.environ, BUILD_DIR=os.path.join(SCRATCH, "build"))
    subprocess.run(["bash", "scripts/build.sh", "-DLF_BUILD_TESTS=ON", "-DLF_BUILD_BENCHMARKS=OFF"], cwd=source,
                   env=env, check=True, stdout=subprocess.DEVNULL)
    return source


def plant(source, bug):
    name, path, before, after, test = bug
    file = os.path.join(source, path)
    text = open(file).read()
    if text.count(before) != 1:
        return f"{name}: the line to change is not in {path} exactly once (the code moved: update the table)"
    open(file, "w").write(text.replace(before, after))
    try:
        env = dict(os.environ, BUILD_DIR=os.path.join(SCRATCH, "build"))
        built = subprocess.run(["bash", "scripts/build.sh"], cwd=source, env=env, capture_output=True, text=True)
        if built.returncode != 0:
            return f"{name}: NOT PLANTED: the changed source does not compile (update the table)"
        tested = subprocess.run(["ctest", "-R", f"^{test}$", "--output-on-failure"], cwd=os.path.join(SCRATCH, "build"),
                                capture_output=True, text=True)
        if "No tests were found" in tested.stdout + tested.stderr:
            return f"{name}: MISSED (no test {test})"
        return f"{name}: caught by {test}" if tested.returncode != 0 else f"{name}: MISSED by {test}"
    finally:
        open(file, "w").write(text)


def main():
    names = sys.argv[1:]
    if names == ["--list"]:
        for bug in BUGS:
            print(f"{bug[0]}: {bug[1]}: '{bug[2]}' -> '{bug[3]}' (caught by {bug[4]})")
        return 0
    chosen = [bug for bug in BUGS if not names or bug[0] in names]
    unknown = set(names) - {bug[0] for bug in BUGS}
    if unknown:
        print("planted_bugs: unknown bug(s) " + ", ".join(sorted(unknown)) + "; --list shows them", file=sys.stderr)
        return 2
    source = prepare()
    # Each test must pass on the unchanged tree first, or a failure would prove nothing.
    baseline_failures = [test for test in sorted({bug[4] for bug in chosen})
                         if run(["ctest", "-R", f"^{test}$"], cwd=os.path.join(SCRATCH, "build"),
                                capture_output=True).returncode != 0]
    if baseline_failures:
        print("planted_bugs: these tests fail without any planted bug: " + ", ".join(baseline_failures), file=sys.stderr)
        return 1
    results = [plant(source, bug) for bug in chosen]
    for line in results:
        print(line, flush=True)
    missed = [line for line in results if not line.split(": ", 1)[1].startswith("caught by")]
    print(f"planted {len(results)}, caught {len(results) - len(missed)}, missed {len(missed)}")
    subprocess.run(["bash", "scripts/build.sh"], cwd=source, env=dict(os.environ, BUILD_DIR=os.path.join(SCRATCH, "build")),
                   stdout=subprocess.DEVNULL)
    return 0 if not missed else 1


if __name__ == "__main__":
    sys.exit(main())
