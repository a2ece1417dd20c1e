#!/usr/bin/env python3
"""Plants one-line bugs, one at a time, in a scratch copy of the source tree, rebuilds, runs the
test that must catch each, and reports caught or missed (docs/testing.md, "Planted bugs"). On
demand, not in CI: the scratch build is cold the first time (about 10 minutes on 2 cores), then
each bug costs a rebuild of its unity batch, the links of the programs its test runs, and the test.

    python3 scripts/planted_bugs.py [NAME...]          no name: every bug; --list: the table
    python3 scripts/planted_bugs.py --check [NAME...]  the table still applies (no build)
    python3 scripts/planted_bugs.py --in-place [NAME...]
                                            plants in this tree and its build/ (BUILD_DIR), warm:
                                            no scratch copy; each line is put back after its test,
                                            and a final build restores every program
Every test in the table must pass on the unchanged tree first. Exit status 0 when every planted
bug was caught, 1 otherwise (a change that no longer applies or compiles counts as not caught). PLANTED_DIR (default
/tmp/lf-planted) holds the scratch copy and its build.

--check (CTest: docs.planted_bugs_each_row_applies_once) builds nothing: every row's file exists,
its line occurs there exactly once, its change differs from it, and its test is a name CTest
would have (read from tests/CMakeLists.txt and the folders it adds, see ctest_names). Exit status
1, naming each bad row, when any fails."""
import json
import os
import re
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRATCH = os.environ.get("PLANTED_DIR", "/tmp/lf-planted")
IN_PLACE = "--in-place" in sys.argv[1:]
BUILD = os.environ.get("BUILD_DIR", os.path.join(ROOT, "build")) if IN_PLACE else os.path.join(SCRATCH, "build")

# name, file, the line's text as it is, the planted text, the test (ctest -R, anchored) that must fail.
BUGS = [
    ("ddp-buffers-not-broadcast", "lib/src/strategies/ddp.cpp",
     "if (!options_.broadcast_buffers || world_size() < 2) return;", "return;",
     "ddp.checks_on_2_ranks"),
    ("tensor-group-broadcast-skipped", "lib/src/strategies/composed.cpp",
     "broadcast_module_from_rank_zero(*module, {}, pipe_ != nullptr ? &mesh_->group(\"stage\") : &collective());",
     ";",
     "model_parallel.trains_like_one_process_on_mesh_1x2_shm"),
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
     "epoch_ = *control_->next_epoch;", ";",
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
     "return options.sync_grads ? GatherWithGradients::apply(tensor, group, options.group) : group->all_gather(tensor);",
     "return group->all_gather(tensor);",
     "research_loops.match_one_process_ddp_32-true_on_2_ranks"),
    ("fsdp-no-grad-forward-frees-saved-parameters", "lib/src/strategies/fsdp.cpp",
     "if (sharded.awaiting_backward) {", "if (false) {",
     "research_loops.match_one_process_fsdp_32-true_on_2_ranks"),
    ("pickle-build-not-in-place", "lib/src/checkpoint/pickle_tree.cpp",
     "NodePtr state = pop(), object = pop();\n        auto unbuilt",
     "NodePtr state = pop(), object = std::make_shared<Node>(*pop());\n        auto unbuilt",
     "unit.test_checkpoint_format"),
    ("pipeline-micro-batch-gradients-summed", "lib/src/strategies/pipeline.cpp",
     "seed = at::full({}, 1.0 / m, root.options());", "seed = at::full({}, 1.0, root.options());",
     "pipeline.trains_like_one_process_4x1x1_1F1B_gloo"),
    ("pipeline-1f1b-warmup-one-too-many", "lib/src/strategies/pipeline_schedule.cpp",
     "warmup = std::min(P - rank - 1, total);", "warmup = std::min(P - rank, total);",
     "unit.test_pipeline_schedule"),
    ("streaming-resume-restarts-the-epoch", "lib/src/data/streaming_loader.cpp",
     "p.current.taken = last.taken;", ";",
     "unit.test_streaming"),
    ("resume-generators-not-restored", "lib/src/resume_state.cpp",
     "here[i].set_state(row.narrow(0, offset, sizes[i]).clone());", ";",
     "unit.test_resume_state"),
    ("resume-save-before-a-pass-forgets-the-position", "lib/src/resume_state.cpp",
     "if (control.next_epoch) {", "if (false) {",
     "unit.test_resume_state"),
    ("sync-batch-norm-count-ignores-spatial-dims", "lib/src/sync_batch_norm.cpp",
     "at::full({1}, static_cast<double>(input.numel() / std::max<int64_t>(channels, 1)),",
     "at::full({1}, static_cast<double>(input.size(0)),",
     "ddp.sync_batch_norm_equals_one_process_batch_norm_on_2_ranks"),
    # lf::snapshot_state_dict's deep CPU copy: the line is the one that function must hold.
    ("state-dict-snapshot-shares-storage", "lib/src/checkpoint/state_dict.cpp",
     "return tensor.detach().to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true);",
     "return tensor;",
     "unit.test_state_dict"),
    ("context-gradients-averaged-over-data-only", "lib/src/strategies/composed.cpp",
     "return options_.context_parallel_size > 1 ? \"data_context\" : \"data\";", "return \"data\";",
     "model_parallel.context_parallel_trains_like_one_process_on_mesh_context2_tensor2_checkpointed_blocks"),
    ("context-positions-local", "lib/src/context_parallel/attention.cpp",
     "return size > 1 ? region->shard(all, 0) : all;", "return all.narrow(0, 0, local_length);",
     "model_parallel.context_parallel_trains_like_one_process_on_mesh_shard2_context2"),
    ("ema-gather-places-every-replica", "lib/src/strategies/strategy.cpp",
     "if (placement.writes) place_into_whole(whole, placement, values.reshape(placement.local_shape()));",
     "place_into_whole(whole, placement, values.reshape(placement.local_shape()));",
     "ema.matches_the_reference_and_resumes_model_parallel_ddp_on_4_ranks"),
    ("clip-counts-every-replica", "lib/src/strategies/strategy.cpp",
     "} else if (placement->writes) {", "} else {",
     "model_parallel.trains_like_one_process_on_mesh_2x2_shm"),
    ("rollback-reloads-the-streaming-loader", "lib/src/fabric.cpp",
     "if (entry.kind() == StateEntry::Kind::Object && dynamic_cast<const StreamingDataLoader*>(&entry.object()) == nullptr) {",
     "if (entry.kind() == StateEntry::Kind::Object) {",
     "streaming.jobs_on_1_2_4_ranks_and_2_nodes_resume_exactly_after_a_kill"),
    ("resume-leaves-the-streaming-loader-at-its-start", "lib/src/resume_state.cpp",
     "for (size_t i = 0; i < streaming.size(); ++i) streaming[i]->load_state_dict(streaming_states[i].toGenericDict());",
     ";", "streaming.jobs_on_1_2_4_ranks_and_2_nodes_resume_exactly_after_a_kill"),
    ("whole-file-zstd-chunks-kept-for-the-datasets-life", "lib/src/data/streaming_dataset.cpp",
     "static constexpr size_t kInflatedChunks = 4;", "static constexpr size_t kInflatedChunks = 1000;",
     "unit.test_streaming"),
    ("chunk-cache-ignores-its-budget", "lib/src/data/chunk_cache.cpp",
     "remote_(std::move(remote)), budget_(budget),", "remote_(std::move(remote)), budget_(budget * 100),",
     "streaming.s3_datasets_read_as_python_litdata_reads_them_and_train_on_2_ranks"),
    ("reader-waits-on-its-own-idle-chunks", "lib/src/data/chunk_cache.cpp",
     "if (release_idle) release_idle();", ";",
     "streaming.s3_datasets_read_as_python_litdata_reads_them_and_train_on_2_ranks"),
    ("checkpoint-recompute-outside-the-context-region", "lib/src/utilities/activation_checkpoint.cpp",
     "if (call->in_context_region) region.emplace(call->context_mesh, call->context_load_balance);", ";",
     "model_parallel.context_parallel_trains_like_one_process_on_mesh_context2_tensor2_checkpointed_blocks"),
    ("shm-recv-ignores-the-tag", "lib/src/plugins/collectives/shm_point_to_point.cpp",
     "[&](const auto& op) { return op->tag == header.tag; });", "[&](const auto&) { return true; });",
     "shm.matches_gloo_on_2_ranks"),
    ("shm-point-to-point-thread-idle", "lib/src/plugins/collectives/shm_point_to_point.cpp",
     "      progress();\n      waiting = pending();", "      waiting = pending();",
     "shm.matches_gloo_on_2_ranks"),
    ("shm-gloo-subgroup-without-its-host-vote", "lib/src/plugins/collectives/collective.cpp",
     "if (!backend && parent.impl_->backend == ProcessGroupBackend::ShmGloo) {", "if (false) {",
     "collectives.api_on_4_ranks_shm+gloo"),
    ("snapshot-restore-takes-a-torn-one", "lib/src/fabric_snapshot.cpp",
     'if (!names.count(".metadata")) return "its .metadata (written last) is missing";',
     'if (!names.count(".metadata")) return "";',
     "unit.test_node_memory"),
    ("node-memory-copies-to-no-buddy", "lib/src/storage/node_memory.cpp",
     "impl.buddy = endpoints.size() > 1 ? endpoints[(static_cast<size_t>(self) + 1) % endpoints.size()] : std::string();",
     "impl.buddy = std::string();",
     "unit.test_node_memory"),
    ("node-memory-keeps-a-torn-copy", "lib/src/storage/node_memory.cpp",
     "    if (!whole) {\n      ::close(fd);\n      return -1;\n    }\n", "",
     "unit.test_node_memory"),
    ("node-memory-keeps-its-staging", "lib/src/storage/node_memory.cpp",
     "    if (!staging.empty()) std::filesystem::remove_all(staging, ignored);\n", "",
     "unit.test_node_memory"),
]


# ---- --check: the table still applies, without a build ----

def cmake_commands(text):
    """The commands of a CMake file: (name, [(text, quoted)], line). Arguments are unevaluated;
    nested parentheses come through as arguments of their own, as CMake passes them to if()."""
    commands, i, n, line = [], 0, len(text), 1

    def skip_comment(i):  # at '#': a line comment or a bracket comment
        bracket = re.match(r"#\[(=*)\[", text[i:i + 40])
        if bracket:
            end = text.find("]" + bracket.group(1) + "]", i)
            return n if end < 0 else end + len(bracket.group(1)) + 2
        end = text.find("\n", i)
        return n if end < 0 else end

    while i < n:
        c = text[i]
        if c.isspace():
            i += 1
            continue
        if c == "#":
            i = skip_comment(i)
            continue
        word = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\s*\(").match(text, i)
        if not word:
            raise ValueError(f"line {text.count(chr(10), 0, i) + 1}: expected a command, found {text[i:i + 30]!r}")
        name, line = word.group(0).split("(")[0].strip().lower(), text.count("\n", 0, i) + 1
        i, depth, args = word.end(), 0, []
        while True:
            if i >= n:
                raise ValueError(f"line {line}: {name}( is never closed")
            c = text[i]
            if c.isspace():
                i += 1
            elif c == "#":
                i = skip_comment(i)
            elif c == "(":
                depth += 1
                args.append(("(", False))
                i += 1
            elif c == ")":
                i += 1
                if depth == 0:
                    break
                depth -= 1
                args.append((")", False))
            elif c == '"':
                value, i = [], i + 1
                while text[i] != '"':
                    if text[i] == "\\":
                        following = text[i + 1]
                        if following != "\n":  # a backslash before a newline continues the line
                            value.append({"n": "\n", "t": "\t", "r": "\r"}.get(following, following))
                        i += 2
                    else:
                        value.append(text[i])
                        i += 1
                args.append(("".join(value), True))
                i += 1
            elif re.match(r"\[=*\[", text[i:i + 40]):
                opening = re.match(r"\[(=*)\[", text[i:i + 40])
                end = text.find("]" + opening.group(1) + "]", i)
                args.append((text[i + opening.end():end].lstrip("\n"), True))
                i = end + len(opening.group(1)) + 2
            else:
                value = []
                while i < n and not text[i].isspace() and text[i] not in "()#":
                    if text[i] == "\\":
                        value.append(text[i:i + 2])  # kept: a \; must not split the list
                        i += 2
                    elif text[i] == '"':  # a quoted part inside an unquoted argument (-DX="a b")
                        close = text.index('"', i + 1)
                        value.append(text[i:close + 1])
                        i = close + 1
                    else:
                        value.append(text[i])
                        i += 1
                args.append(("".join(value), False))
        commands.append((name, args, line))
    return commands


class CTestNames:
    """The CTest names the tests' CMakeLists.txt files make, read without CMake: an interpreter of
    the commands those files use (set, list, string, math, foreach, function, add_subdirectory)
    with lf_add_test, add_test, lf_add_test_binary and target_sources built in, and the Catch2
    file tests (lf_add_catch_file_tests: LABEL.FILE for each source of a lf_add_test_binary
    binary with a TEST_CASE) made as tests/CMakeLists.txt makes them. Every branch of every if()
    is taken, so a test made only under some option (LF_BUILD_EXAMPLES, a sanitizer build) counts;
    every other command (add_executable, set_tests_properties, message, ...) is skipped."""

    CATCH_CASE = re.compile(r"^[ \t]*(TEST_CASE|TEST_CASE_METHOD|SCENARIO|TEMPLATE_TEST_CASE)[ \t]*\(", re.M)

    def __init__(self, root):
        self.root = root
        self.names = set()
        self.functions = {}
        self.binaries = {}  # name -> (label, [source paths])
        tests = os.path.join(root, "tests")
        variables = {"PROJECT_SOURCE_DIR": root, "CMAKE_SOURCE_DIR": root, "PROJECT_BINARY_DIR": os.path.join(root, "build"),
                     "CMAKE_BINARY_DIR": os.path.join(root, "build")}
        self.directory(tests, variables)
        for label, sources in self.binaries.values():
            for source in sources:
                if not os.path.isfile(source):
                    continue  # a generated source: no TEST_CASE of ours
                with open(source, errors="replace") as file:
                    if self.CATCH_CASE.search(file.read()):
                        self.names.add(f"{label}.{os.path.splitext(os.path.basename(source))[0]}")

    def directory(self, folder, parent):
        variables = dict(parent)
        variables.update(CMAKE_CURRENT_SOURCE_DIR=folder,
                         CMAKE_CURRENT_BINARY_DIR=os.path.join(self.root, "build", os.path.relpath(folder, self.root)))
        path = os.path.join(folder, "CMakeLists.txt")
        with open(path) as file:
            try:
                commands = cmake_commands(file.read())
                self.block(commands, [variables], path)
            except (ValueError, IndexError) as error:
                raise ValueError(f"{os.path.relpath(path, self.root)}: {error}") from None

    @staticmethod
    def expand(text, scope):
        reference = re.compile(r"\$\{([^${}]*)\}")
        for _ in range(100):  # inner references first: ${a_${b}}
            text, count = reference.subn(lambda m: scope[-1].get(m.group(1), ""), text)
            if not count:
                break
        return re.sub(r"\$ENV\{[^}]*\}", "", text)

    def arguments(self, args, scope):
        out = []
        for text, quoted in args:
            value = self.expand(text, scope)
            if quoted:
                out.append(value)
            else:
                out.extend(part.replace("\\;", ";") for part in re.split(r"(?<!\\);", value) if part != "")
        return out

    @staticmethod
    def matching(commands, start, opening, closing):
        depth = 0
        for k in range(start, len(commands)):
            if commands[k][0] in opening:
                depth += 1
            elif commands[k][0] in closing:
                depth -= 1
                if depth == 0:
                    return k
        raise ValueError(f"{commands[start][0]}() at line {commands[start][2]} has no {sorted(closing)[0]}()")

    def block(self, commands, scope, path):
        k = 0
        while k < len(commands):
            name, args, line = commands[k]
            if name == "foreach":
                end = self.matching(commands, k, {"foreach"}, {"endforeach"})
                values = self.arguments(args, scope)
                variable, items = values[0], values[1:]
                if items[:1] == ["RANGE"]:
                    bounds = [int(v) for v in items[1:]]
                    items = [str(v) for v in (range(bounds[0] + 1) if len(bounds) == 1 else
                                              range(bounds[0], bounds[1] + 1, bounds[2] if len(bounds) > 2 else 1))]
                elif items[:1] == ["IN"]:
                    listed, mode = [], None
                    for item in items[1:]:
                        if item in ("LISTS", "ITEMS"):
                            mode = item
                        elif mode == "LISTS":
                            listed += [v for v in scope[-1].get(item, "").split(";") if v]
                        else:
                            listed.append(item)
                    items = listed
                for item in items:
                    scope[-1][variable] = item
                    self.block(commands[k + 1:end], scope, path)
                k = end + 1
            elif name == "if":  # every branch, in order
                end = self.matching(commands, k, {"if"}, {"endif"})
                body = [c for c in commands[k + 1:end]]
                self.block([c for c in body if not (c[0] in ("elseif", "else") and self.depth_zero(body, c))], scope, path)
                k = end + 1
            elif name in ("function", "macro"):
                end = self.matching(commands, k, {"function", "macro"}, {"endfunction", "endmacro"})
                values = self.arguments(args, scope)
                self.functions[values[0].lower()] = (values[1:], commands[k + 1:end])
                k = end + 1
            else:
                self.command(name, self.arguments(args, scope), scope, path)
                k += 1

    @staticmethod
    def depth_zero(body, command):  # an elseif/else of this if, not of one nested in it
        depth = 0
        for c in body:
            if c is command:
                return depth == 0
            depth += c[0] == "if"
            depth -= c[0] == "endif"
        return False

    def command(self, name, values, scope, path):
        variables = scope[-1]
        folder = variables.get("CMAKE_CURRENT_SOURCE_DIR", "")
        if name in ("lf_add_test", "add_test"):
            if "NAME" in values and values.index("NAME") + 1 < len(values):
                self.names.add(values[values.index("NAME") + 1])
            elif name == "add_test" and values:
                self.names.add(values[0])
        elif name == "lf_add_test_binary":
            self.binaries[values[0]] = (values[1], [os.path.join(folder, v) for v in values[2:]])
        elif name == "target_sources" and values and values[0] in self.binaries:
            self.binaries[values[0]][1].extend(os.path.join(folder, v) for v in values[1:]
                                               if v not in ("PRIVATE", "PUBLIC", "INTERFACE"))
        elif name == "lf_add_catch_file_tests":
            pass  # made for every binary at the end, as tests/CMakeLists.txt does
        elif name == "add_subdirectory":
            self.directory(os.path.normpath(os.path.join(folder, values[0])), variables)
        elif name == "set" and values:
            parent = values[-1] == "PARENT_SCOPE"
            if parent:
                values = values[:-1]
            if "CACHE" in values:
                values = values[:values.index("CACHE")]
            target = scope[-2] if parent and len(scope) > 1 else variables
            if len(values) == 1:
                target.pop(values[0], None)
            else:
                target[values[0]] = ";".join(values[1:])
        elif name == "unset" and values:
            variables.pop(values[0], None)
        elif name == "list" and len(values) >= 2:
            self.list_command(values, variables)
        elif name == "string" and values:
            self.string_command(values, variables)
        elif name == "math" and len(values) >= 3 and values[0] == "EXPR":
            expression = values[2]
            if re.fullmatch(r"[0-9+\-*/%() \t]*", expression):
                variables[values[1]] = str(int(eval(expression.replace("/", "//"))))
        elif name in self.functions:
            parameters, body = self.functions[name]
            local = dict(variables)
            for index, value in enumerate(values):
                local[f"ARGV{index}"] = value
            for parameter, value in zip(parameters, values):
                local[parameter] = value
            local.update(ARGC=str(len(values)), ARGV=";".join(values), ARGN=";".join(values[len(parameters):]))
            self.block(body, scope + [local], path)

    @staticmethod
    def list_command(values, variables):
        operation, name = values[0], values[1]
        items = [v for v in variables.get(name, "").split(";") if v]
        if operation == "APPEND":
            variables[name] = ";".join(items + values[2:])
        elif operation == "PREPEND":
            variables[name] = ";".join(values[2:] + items)
        elif operation == "LENGTH":
            variables[values[2]] = str(len(items))
        elif operation == "GET":
            variables[values[-1]] = ";".join(items[int(i)] for i in values[2:-1] if -len(items) <= int(i) < len(items))
        elif operation in ("POP_FRONT", "POP_BACK"):
            for out in values[2:]:
                if items:
                    variables[out] = items.pop(0 if operation == "POP_FRONT" else -1)
            variables[name] = ";".join(items)

    @staticmethod
    def string_command(values, variables):
        operation = values[0]
        if operation == "REPLACE" and len(values) >= 4:
            variables[values[3]] = "".join(values[4:]).replace(values[1], values[2])
        elif operation == "REGEX" and len(values) >= 5 and values[1] in ("MATCH", "REPLACE"):
            pattern = values[2]
            if values[1] == "MATCH":
                found = re.search(pattern, "".join(values[4:]))
                variables[values[3]] = found.group(0) if found else ""
                for index in range(10):
                    group = found.group(index) if found and index <= (found.re.groups) else None
                    variables[f"CMAKE_MATCH_{index}"] = group or ""
            elif len(values) >= 5:
                replacement = re.sub(r"\\([0-9])", r"\\g<\1>", values[3])
                variables[values[4]] = re.sub(pattern, replacement, "".join(values[5:]))
        elif operation in ("TOUPPER", "TOLOWER") and len(values) >= 3:
            variables[values[2]] = values[1].upper() if operation == "TOUPPER" else values[1].lower()


def check(bugs):
    """The reasons each row does not apply, by row name (an empty dict: every row applies)."""
    try:
        names = CTestNames(ROOT).names
    except (ValueError, OSError) as error:
        return {"(every row)": [f"the CTest names could not be read from the tests' CMakeLists.txt: {error} "
                                f"(teach CTestNames in scripts/planted_bugs.py the new construct)"]}
    problems = {}
    for name, path, before, after, test in bugs:
        reasons = []
        if [bug[0] for bug in BUGS].count(name) > 1:
            reasons.append("another row has the same name: name each row once")
        file = os.path.join(ROOT, path)
        if not os.path.isfile(file):
            reasons.append(f"{path} does not exist")
        else:
            with open(file, errors="replace") as source:
                count = source.read().count(before)
            if count == 0:
                reasons.append(f"the line to change is not in {path} (the code moved: find where, update "
                               f"the row): {before!r}")
            elif count > 1:
                reasons.append(f"the line to change occurs {count} times in {path}, not once (add a neighbouring "
                               f"line to the row's text so that it names one place): {before!r}")
        if after == before:
            reasons.append("the planted text is the line itself: it plants nothing")
        if test not in names:
            reasons.append(f"no CTest test is named {test} (tests/**/CMakeLists.txt make {len(names)} names; "
                           f"name an existing test that checks what the bug breaks)")
        if reasons:
            problems[name] = reasons
    return problems


def run(command, **kwargs):
    return subprocess.run(command, cwd=kwargs.pop("cwd", SCRATCH), **kwargs)


def prepare():
    if IN_PLACE:  # the tree itself and its build: no cold scratch build; each line is put back after its test
        if not os.path.exists(os.path.join(BUILD, "CMakeCache.txt")):
            raise SystemExit(f"planted_bugs --in-place: no build in {BUILD}; run scripts/build.sh first")
        return ROOT
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


def programs_of(test):
    """The build targets the test runs: the programs under the scratch build's bin/ that its command
    names, and the launcher, so that a plant rebuilds only its batch and the links the test needs."""
    build = BUILD
    listed = subprocess.run(["ctest", "--show-only=json-v1", "-R", f"^{re.escape(test)}$"], cwd=build, capture_output=True,
                            text=True)
    programs = {"lightning-run", "lightning-run-launcher"}
    try:
        tests = json.loads(listed.stdout).get("tests", [])
    except json.JSONDecodeError:
        return None  # then everything is built
    bin_dir = os.path.join(build, "bin") + os.sep
    for entry in tests:
        for argument in entry.get("command", []):
            if argument.startswith(bin_dir):
                programs.add(os.path.basename(argument))
    return sorted(programs)


def plant(source, bug):
    name, path, before, after, test = bug
    file = os.path.join(source, path)
    text = open(file).read()
    if text.count(before) != 1:
        return f"{name}: the line to change is not in {path} exactly once (the code moved: update the table)"
    open(file, "w").write(text.replace(before, after))
    try:
        env = dict(os.environ, BUILD_DIR=BUILD)
        programs = programs_of(test)
        if programs:
            env["TARGETS"] = " ".join(programs)
        built = subprocess.run(["bash", "scripts/build.sh"], cwd=source, env=env, capture_output=True, text=True)
        if built.returncode != 0:
            return f"{name}: NOT PLANTED: the changed source does not compile (update the table)"
        tested = subprocess.run(["ctest", "-R", f"^{re.escape(test)}$", "--output-on-failure"], cwd=BUILD,
                                capture_output=True, text=True)
        if "No tests were found" in tested.stdout + tested.stderr:
            return f"{name}: MISSED (no test {test})"
        return f"{name}: caught by {test}" if tested.returncode != 0 else f"{name}: MISSED by {test}"
    finally:
        open(file, "w").write(text)


def main():
    names = sys.argv[1:]
    if names[:1] == ["--check"]:
        unknown = set(names[1:]) - {bug[0] for bug in BUGS}
        if unknown:
            print("planted_bugs --check: unknown bug(s) " + ", ".join(sorted(unknown)) + "; --list shows them", file=sys.stderr)
            return 2
        chosen = [bug for bug in BUGS if not names[1:] or bug[0] in names[1:]]
        problems = check(chosen)
        for name, reasons in problems.items():
            for reason in reasons:
                print(f"FAIL: planted_bugs row {name}: {reason}")
        if problems:
            print(f"planted_bugs --check: {len(problems)} of {len(chosen)} rows do not apply (scripts/planted_bugs.py, BUGS)")
            return 1
        print(f"planted_bugs --check: every row applies once ({len(chosen)} rows)")
        return 0
    if names == ["--list"]:
        for bug in BUGS:
            print(f"{bug[0]}: {bug[1]}: '{bug[2]}' -> '{bug[3]}' (caught by {bug[4]})")
        return 0
    names = [name for name in names if name != "--in-place"]
    chosen = [bug for bug in BUGS if not names or bug[0] in names]
    unknown = set(names) - {bug[0] for bug in BUGS}
    if unknown:
        print("planted_bugs: unknown bug(s) " + ", ".join(sorted(unknown)) + "; --list shows them", file=sys.stderr)
        return 2
    source = prepare()
    # Each test must pass on the unchanged tree first, or a failure would prove nothing.
    baseline_failures = [test for test in sorted({bug[4] for bug in chosen})
                         if run(["ctest", "-R", f"^{re.escape(test)}$"], cwd=BUILD,
                                capture_output=True).returncode != 0]
    if baseline_failures:
        print("planted_bugs: these tests fail without any planted bug: " + ", ".join(baseline_failures), file=sys.stderr)
        return 1
    results = [plant(source, bug) for bug in chosen]
    for line in results:
        print(line, flush=True)
    missed = [line for line in results if not line.split(": ", 1)[1].startswith("caught by")]
    print(f"planted {len(results)}, caught {len(results) - len(missed)}, missed {len(missed)}")
    subprocess.run(["bash", "scripts/build.sh"], cwd=source, env=dict(os.environ, BUILD_DIR=BUILD),
                   stdout=subprocess.DEVNULL)
    return 0 if not missed else 1


if __name__ == "__main__":
    sys.exit(main())
