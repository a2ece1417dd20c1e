#!/usr/bin/env bash
# s3:// datasets against a real S3-compatible server (moto's server mode, from PyPI, started here on
# 127.0.0.1 with its signature checking on, and stopped by pid) and Python's litdata:
#   1. litdata.optimize(output_dir="s3://...") writes a dataset to the server; every item
#      lf::StreamingDataset("s3://...") reads equals what litdata's StreamingDataset reads from the
#      same URL, and the loader's batches equal litdata's StreamingDataLoader's (shuffled, 1 and 2
#      ranks);
#      lf::StreamingWriter writes datasets to the server that litdata reads item for item;
#   2. a 2-rank lightning-run job trains on it behind Fabric, both ranks downloading into one
#      shared cache folder: each rank takes its planned batches, and each chunk is fetched once
#      (the server's log counts the GETs); under a cache budget of 5 chunks the loader reads
#      litdata's batches, the cache stays within its budget and evicts what was read, and a dead
#      downloader's reservation is cleared;
#   3. refusals, each exit 1 with the URL named: a missing bucket, a cache budget smaller than a chunk, a prefix without a dataset, a
#      URL without a bucket, a second dataset written to one prefix, no credentials, a wrong secret
#      (SignatureDoesNotMatch), an unknown access key; and with the
#      server stopped after the dataset opened, the read of a chunk not yet cached fails after its
#      retries naming the chunk (no item read), and opening fails likewise.
#   4. sharded checkpoints (fsdp, torch.distributed.checkpoint's layout) on s3:// from a 2-rank job:
#      fabric.save and save_in_background write the same objects, byte for byte as a local save's
#      files; Python's torch.distributed.checkpoint reads them after a download; `lightning-run
#      model consolidate` reads the folder from s3:// and writes the file there, which Python's
#      torch.load reads with the tensors DCP read; a job SIGKILLed during a background save over
#      its earlier checkpoint leaves one of the two whole (fabric.load checks the loss); a prefix
#      with parts and no .metadata is refused by name (load and consolidate).
# Usage: s3_streaming.sh LIGHTNING_RUN STREAMING_CHECKS BACKGROUND_SAVE_CHECKS   (LF_PYTHON: a Python
# with litdata and moto)
set -uo pipefail
run="$1"; checks="$2"; saves="$3"
python="${LF_PYTHON:-python3}"
peer="$(dirname "${BASH_SOURCE[0]}")/litdata_peer.py"
"$python" -c "import litdata, moto" 2>/dev/null || { echo "FAIL: $python lacks litdata or moto (scripts/install-deps.sh)"; exit 1; }
dir="$(mktemp -d)"
server=""
cleanup() { [ -n "$server" ] && kill "$server" 2>/dev/null && wait "$server" 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }
export OMP_NUM_THREADS=1
py() { HOME="$dir/home" "$python" "$peer" "$@"; }  # litdata caches what it reads under $HOME/.lightning

port=$("$python" -c "import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); print(s.getsockname()[1])")
# Signature checking on: after the first 4 requests (the readiness probe, an IAM user, its policy,
# its access key), every request must carry a valid AWS Signature Version 4 of a known key.
INITIAL_NO_AUTH_ACTION_COUNT=4 "$(dirname "$python")/moto_server" -H 127.0.0.1 -p "$port" > "$dir/server.log" 2>&1 &
server=$!
export AWS_DEFAULT_REGION=us-east-1 AWS_ENDPOINT_URL="http://127.0.0.1:$port" LT_STREAMING_CACHE_DIR="$dir/cache"
for _ in $(seq 100); do curl -s -o /dev/null "$AWS_ENDPOINT_URL" && break; sleep 0.1; done
read -r AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY < <("$python" - <<'PY'
import json, os
import boto3
iam = boto3.client("iam", endpoint_url=os.environ["AWS_ENDPOINT_URL"], aws_access_key_id="setup", aws_secret_access_key="setup")
iam.create_user(UserName="lf-test")
iam.put_user_policy(UserName="lf-test", PolicyName="s3", PolicyDocument=json.dumps(
    {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
key = iam.create_access_key(UserName="lf-test")["AccessKey"]
boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"], aws_access_key_id=key["AccessKeyId"],
             aws_secret_access_key=key["SecretAccessKey"]).create_bucket(Bucket="data")
print(key["AccessKeyId"], key["SecretAccessKey"])
PY
)
[ -n "${AWS_SECRET_ACCESS_KEY:-}" ] || fail "the S3 server gave no access key or bucket ($(tail -3 "$dir/server.log"))"
export AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY
source "$(dirname "${BASH_SOURCE[0]}")/compare_lines.sh"  # same FILE_A FILE_B WHAT

# 1. litdata writes to the server; C++ and Python read the same items and batches from it.
py write ids s3://data/ids > "$dir/write.log" 2>&1 || { tail -20 "$dir/write.log"; fail "litdata.optimize to s3://data/ids"; }
(cd "$dir" && py dump s3://data/ids > "$dir/items.python" 2> "$dir/dump.err") || { tail -5 "$dir/dump.err"; fail "litdata reading s3://data/ids"; }
"$checks" dump s3://data/ids > "$dir/items.cpp" || fail "lf::StreamingDataset reading s3://data/ids exited with $?"
same "$dir/items.python" "$dir/items.cpp" "items of s3://data/ids read by Python's litdata and C++"
configs=(1,0,0,4,1,1 2,0,2,3,1,2 2,1,2,3,1,2)
(cd "$dir" && py order s3://data/ids "${configs[@]}" > "$dir/order.python" 2> "$dir/order.err") || { tail -5 "$dir/order.err"; fail "litdata's loader on s3://data/ids"; }
"$checks" order s3://data/ids "${configs[@]}" > "$dir/order.cpp" || fail "lf::StreamingDataLoader on s3://data/ids exited with $?"
same "$dir/order.python" "$dir/order.cpp" "batches of s3://data/ids from litdata's StreamingDataLoader and lf::StreamingDataLoader"

# lf::StreamingWriter writes to the server (chunks as they fill, index.json last); Python reads it.
for kind in mixed ids-zstd; do
  "$checks" write $kind s3://data/cpp-$kind || fail "lf::StreamingWriter to s3://data/cpp-$kind exited with $?"
  py dump s3://data/cpp-$kind > "$dir/cpp-$kind.python" 2> "$dir/cpp-dump.err" || { tail -5 "$dir/cpp-dump.err"; fail "litdata reading s3://data/cpp-$kind"; }
  "$checks" dump s3://data/cpp-$kind > "$dir/cpp-$kind.cpp"
  same "$dir/cpp-$kind.python" "$dir/cpp-$kind.cpp" "items lf::StreamingWriter wrote to s3://data/cpp-$kind, read by Python's litdata and C++"
done

# 2. A 2-rank training job on the s3:// dataset, both ranks sharing one fresh cache folder: each
# chunk is downloaded once on the node (the server's log counts the GETs), over 2 epochs.
export LT_STREAMING_CACHE_DIR="$dir/shared-cache"
mkdir -p "$dir/job"
log_before=$(wc -l < "$dir/server.log")
timeout 120 "$run" model --accelerator cpu --devices 2 "$checks" train s3://data/ids "$dir/job" --batch 4 --workers 2 \
  --shuffle --epochs 2 > "$dir/job.out" 2>&1 || fail "the 2-rank job on s3://data/ids exited with $? ($(tail -3 "$dir/job.out"))"
for r in 0 1; do
  "$checks" order s3://data/ids "2,$r,2,4,1,2" | sed 's/^[^ ]* epoch/epoch/' > "$dir/plan$r"
  cmp -s "$dir/plan$r" "$dir/job/rank-$r.log" || { diff "$dir/plan$r" "$dir/job/rank-$r.log" | head -3; fail "rank $r of the s3:// job did not take its planned batches"; }
done
leftovers=$(find "$dir/shared-cache" -name '*.part-*' -o -name '*.reserve' | wc -l)
(( leftovers == 0 )) || fail "$leftovers partial downloads or reservations left in the shared cache"
chunks=$(grep -o '"filename"' "$dir"/shared-cache/*/index.json | wc -l)
gets=$(tail -n +$((log_before + 1)) "$dir/server.log" | grep -c '"GET /data/ids/chunk-')
downloads=$(cat "$dir/job/rank-0.cache" "$dir/job/rank-1.cache" | awk '{n += $2} END {print n}')
(( gets == chunks && downloads == chunks )) ||
  fail "the 2-rank job fetched its $chunks chunks $gets times (the server's count; the ranks count $downloads), not once each"
echo "ok: a 2-rank job trained on s3://data/ids behind Fabric, each rank its planned batches, one shared cache, each of its $chunks chunks fetched once"

# The same job killed after 3 batches with its checkpoint on s3://, resumed from it with a fresh
# 10-chunk cache the two ranks share: every rank continues with the uninterrupted job's batches,
# losses and parameters.
mkdir -p "$dir/first" "$dir/resumed"
LT_STREAMING_CACHE_DIR="$dir/first-cache" timeout 120 "$run" model --accelerator cpu --devices 2 "$checks" train s3://data/ids "$dir/first" \
  --batch 4 --workers 2 --shuffle --save-after 3 s3://data/resume.ckpt --kill > "$dir/first.out" 2>&1; code=$?
(( code == 137 )) || fail "the killed job exited with $code, expected 137 ($(tail -3 "$dir/first.out"))"
largest=$(find "$dir/shared-cache" -name 'chunk-*.bin' -printf '%s\n' | sort -n | tail -1)
MAX_CACHE_BYTES=$((10 * largest)) LT_STREAMING_CACHE_DIR="$dir/resume-cache" timeout 120 "$run" model --accelerator cpu --devices 2 \
  "$checks" train s3://data/ids "$dir/resumed" --batch 4 --workers 2 --shuffle --epochs 2 --resume s3://data/resume.ckpt > "$dir/resumed.out" 2>&1 ||
  fail "the job resumed from s3://data/resume.ckpt exited with $? ($(tail -3 "$dir/resumed.out"))"
for r in 0 1; do
  for kind in log loss; do
    cat "$dir/first/rank-$r.$kind" "$dir/resumed/rank-$r.$kind" | cmp -s - "$dir/job/rank-$r.$kind" ||
      fail "rank $r resumed from s3://data/resume.ckpt did not continue as the uninterrupted job ($kind)"
  done
done
echo "ok: killed after 3 batches, resumed from s3://data/resume.ckpt under a 10-chunk cache: batches, losses and parameters as the uninterrupted job's, bit for bit"

# A cache budget of 5 chunks (what the pass reads at once): a shuffled 2-epoch pass on 2 workers' order reads litdata's batches,
# the cache never holds more than its budget, and read chunks are evicted (fetched again in epoch 2).
# A reservation and a partial download left by a killed downloader are cleared, not counted.
largest=$(find "$dir/shared-cache" -name 'chunk-*.bin' -printf '%s\n' | sort -n | tail -1)
budget=$((5 * largest))
export LT_STREAMING_CACHE_DIR="$dir/small-cache"
tight=2,1,2,3,1,2
MAX_CACHE_BYTES=$budget "$checks" order s3://data/ids $tight > "$dir/tight.cpp" 2> "$dir/tight.err" ||
  fail "the loader under a $budget-byte cache budget exited with $? ($(tail -2 "$dir/tight.err"))"
grep "^$tight " "$dir/order.python" > "$dir/tight.python"
same "$dir/tight.python" "$dir/tight.cpp" "batches of s3://data/ids under a 5-chunk cache budget and litdata's"
read -r _ _ peak _ downloads < "$dir/tight.err"
(( peak > 0 && peak <= budget )) || fail "the cache's peak $peak bytes is not within its budget $budget"
(( downloads > $(ls "$dir/small-cache"/*/chunk-*.bin | wc -l) )) || fail "no chunk was evicted under a 5-chunk budget ($downloads downloads)"
held=$(find "$dir/small-cache" -name 'chunk-*.bin' -printf '%s\n' | awk '{n += $1} END {print n}')
(( held <= budget )) || fail "the cache holds $held bytes after the pass, over its budget $budget"
# Items read one by one without a loader, under a 2-chunk budget: the dataset lets its idle open
# chunks go when it needs room.
LT_STREAMING_CACHE_DIR="$dir/tiny-cache" MAX_CACHE_BYTES=$((2 * largest)) timeout 60 "$checks" dump s3://data/ids > "$dir/tiny.cpp" ||
  fail "reading s3://data/ids item by item under a 2-chunk budget exited with $?"
same "$dir/items.python" "$dir/tiny.cpp" "items of s3://data/ids read one by one under a 2-chunk budget and litdata's"
cached=$(ls -d "$dir/small-cache"/*/)
truncate -s 1G "${cached}chunk-0-0.bin.reserve"; echo torn > "${cached}chunk-0-0.bin.part-1-2"; rm -f "${cached}chunk-0-0.bin"
MAX_CACHE_BYTES=$budget "$checks" order s3://data/ids $tight > "$dir/tight2.cpp" 2> "$dir/tight.err" ||
  fail "the loader beside a dead downloader's reservation exited with $? ($(tail -2 "$dir/tight.err"))"
same "$dir/tight.python" "$dir/tight2.cpp" "batches of s3://data/ids beside a dead downloader's reservation"
[ ! -e "${cached}chunk-0-0.bin.reserve" ] && [ ! -e "${cached}chunk-0-0.bin.part-1-2" ] || fail "a dead downloader's reservation or partial file was left"
echo "ok: under a 5-chunk budget ($budget bytes) litdata's batches, peak $peak bytes, $downloads downloads; a dead downloader's reservation cleared"

# 3. Checkpoints on s3://: a 2-rank ddp job saves one file there and loads it back; Python's
# torch.load reads the same object.
timeout 120 "$run" model --accelerator cpu --devices 2 "$checks" checkpoint s3://data/ck/model.ckpt > "$dir/ck.out" 2>&1 ||
  fail "the 2-rank job saving to s3://data/ck/model.ckpt exited with $? ($(tail -3 "$dir/ck.out"))"
"$python" - <<'PY' || fail "Python's torch.load of s3://data/ck/model.ckpt"
import io, os
import boto3, torch
body = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"]).get_object(Bucket="data", Key="ck/model.ckpt")["Body"].read()
state = torch.load(io.BytesIO(body))
assert state["step"] == 17 and state["model"]["weight"].shape == (3, 4), state
print("ok: Python's torch.load reads s3://data/ck/model.ckpt: step", state["step"], "weight", tuple(state["model"]["weight"].shape))
PY
"$checks" load s3://data/ck/model.ckpt | sort | tr '\n' ' ' | grep -q "^model step $" || fail "fabric.load(s3://data/ck/model.ckpt) does not list model and step"
echo "ok: a 2-rank job saved s3://data/ck/model.ckpt and loaded it back equal"

# Sharded checkpoints on s3://: the same state saved by fabric.save and in the background, equal
# object for object to a local save's files.
export TMPDIR="$dir/tmp"; mkdir -p "$TMPDIR" "$dir/bg-local" "$dir/bg-s3"
timeout 120 "$run" model --accelerator cpu --devices 2 "$saves" same fsdp "$dir/bg-local" > "$dir/bg.out" 2>&1 ||
  fail "the local sharded save exited with $? ($(tail -3 "$dir/bg.out"))"
LF_CHECKPOINT_ROOT=s3://data/bg timeout 120 "$run" model --accelerator cpu --devices 2 "$saves" same fsdp "$dir/bg-s3" > "$dir/bg.out" 2>&1 ||
  fail "the sharded save to s3://data/bg exited with $? ($(tail -3 "$dir/bg.out"))"
"$python" - "$dir" <<'PY' || fail "the sharded checkpoints on s3:// against the local save and Python's DCP"
import io, os, sys
import boto3, torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
root = sys.argv[1]
s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
for kind in ("sync", "background"):
    local = os.path.join(root, "bg-local", "sync")
    names = sorted(o["Key"].split("/")[-1] for o in s3.list_objects_v2(Bucket="data", Prefix="bg/%s/" % kind)["Contents"])
    assert names == sorted(os.listdir(local)), (kind, names, sorted(os.listdir(local)))
    got = os.path.join(root, "bg-s3", kind)
    os.makedirs(got)
    for name in names:
        body = s3.get_object(Bucket="data", Key="bg/%s/%s" % (kind, name))["Body"].read()
        assert body == open(os.path.join(local, name), "rb").read(), "s3://data/bg/%s/%s differs from the local save" % (kind, name)
        open(os.path.join(got, name), "wb").write(body)
dcp_to_torch_save(os.path.join(root, "bg-s3", "sync"), os.path.join(root, "bg-s3", "dcp.pt"))
whole = torch.load(os.path.join(root, "bg-s3", "dcp.pt"))
assert "model" in whole and "optimizer" in whole, sorted(whole)
assert torch.load(os.path.join(root, "bg-s3", "sync", "meta.pt"))["step"] == 2  # Python Fabric's rest of the state
print("ok: fabric.save and save_in_background to s3://data/bg wrote %d objects each, equal to a local save's files; "
      "Python's DCP reads them: %d model tensors" % (len(names), len(whole["model"])))
PY
"$run" model consolidate s3://data/bg/sync --output-file s3://data/bg/full.pt > "$dir/consolidate.out" 2>&1 ||
  fail "lightning-run model consolidate s3://data/bg/sync exited with $? ($(tail -2 "$dir/consolidate.out"))"
"$python" - "$dir" <<'PY' || fail "Python's torch.load of s3://data/bg/full.pt against DCP's reading"
import io, os, sys
import boto3, torch
s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
full = torch.load(io.BytesIO(s3.get_object(Bucket="data", Key="bg/full.pt")["Body"].read()))
dcp = torch.load(os.path.join(sys.argv[1], "bg-s3", "dcp.pt"))
assert sorted(full["model"]) == sorted(dcp["model"]), (sorted(full["model"]), sorted(dcp["model"]))
for name, tensor in dcp["model"].items():
    assert torch.equal(full["model"][name], tensor), name
print("ok: lightning-run model consolidate s3://data/bg/sync -> s3://data/bg/full.pt: torch.load reads it, %d tensors equal to DCP's" % len(dcp["model"]))
PY
# Killed during a background save over its earlier checkpoint (step 1): one of the two is whole.
mkdir -p "$dir/kill"
export HANG_WIDTH=1024 LF_CHECKPOINT_ROOT=s3://data/kill
"$run" model --accelerator cpu --devices 2 "$saves" hang fsdp "$dir/kill" > "$dir/kill.log" 2>&1 &
launcher=$!
for _ in $(seq 2400); do grep -q "background save started" "$dir/kill.log" && break; sleep 0.05; done
grep -q "background save started" "$dir/kill.log" || fail "the background save to s3://data/kill/ck did not start ($(tail -3 "$dir/kill.log"))"
for _ in $(seq 1000); do compgen -G "$TMPDIR/lightning-fabric-checkpoint-save-*/__*" > /dev/null && break; sleep 0.002; done
pkill -9 -f "$saves hang fsdp $dir/kill"
wait "$launcher" 2>/dev/null
objects=$(grep -c . <("$python" -c "import boto3,os; [print(o['Key']) for o in boto3.client('s3',endpoint_url=os.environ['AWS_ENDPOINT_URL']).list_objects_v2(Bucket='data',Prefix='kill/ck/')['Contents']]"))
timeout 120 "$run" model --accelerator cpu --devices 2 "$saves" check fsdp "$dir/kill" > "$dir/check.out" 2>&1 ||
  fail "after a kill during the background save to s3://data/kill/ck, loading it exited with $? ($(tail -3 "$dir/check.out"))"
echo "ok: killed during a background save over s3://data/kill/ck ($objects objects there): $(grep -o "step [12]" "$dir/check.out" | head -1) loads whole"
# The server unreachable during a background save over an earlier checkpoint: the job reaches the
# server through a TCP relay, stopped once the save is writing; the uploads fail after their
# retries, the job exits non-zero naming the object, and the earlier checkpoint loads whole.
relay_port=$("$python" -c "import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); print(s.getsockname()[1])")
"$python" - "$relay_port" "$port" <<'PY' > /dev/null 2>&1 &
import socket, sys, threading
listener = socket.create_server(("127.0.0.1", int(sys.argv[1])))
def pipe(a, b):
    try:
        while (data := a.recv(1 << 16)):
            b.sendall(data)
    except OSError:
        pass
    for s in (a, b):
        try: s.shutdown(socket.SHUT_RDWR)
        except OSError: pass
while True:
    client, _ = listener.accept()
    server = socket.create_connection(("127.0.0.1", int(sys.argv[2])))
    for a, b in ((client, server), (server, client)):
        threading.Thread(target=pipe, args=(a, b), daemon=True).start()
PY
relay=$!
for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$relay_port" && break; sleep 0.1; done
export LF_CHECKPOINT_ROOT=s3://data/cut
rm -rf "$TMPDIR"/lightning-fabric-checkpoint-save-*; mkdir -p "$dir/cut"
AWS_ENDPOINT_URL="http://127.0.0.1:$relay_port" "$run" model --accelerator cpu --devices 2 "$saves" hang fsdp "$dir/cut" > "$dir/cut.log" 2>&1 &
launcher=$!
for _ in $(seq 2400); do grep -q "background save started" "$dir/cut.log" && break; sleep 0.05; done
grep -q "background save started" "$dir/cut.log" || fail "the background save to s3://data/cut/ck did not start ($(tail -3 "$dir/cut.log"))"
for _ in $(seq 1000); do compgen -G "$TMPDIR/lightning-fabric-checkpoint-save-*/__*" > /dev/null && break; sleep 0.002; done
kill -9 "$relay"; wait "$relay" 2>/dev/null
code=0; timeout 120 tail --pid="$launcher" -f /dev/null; wait "$launcher" || code=$?
(( code != 0 )) || fail "the job whose server went away during its save exited 0"
grep -q "s3://data/cut/ck/__[01]_0-[0-9a-f]*.distcp.*failed after 6 tries" "$dir/cut.log" ||
  fail "the failed upload is not named with its retries: $(grep -m1 -i "error\|failed" "$dir/cut.log")"
timeout 120 "$run" model --accelerator cpu --devices 2 "$saves" check fsdp "$dir/cut" > "$dir/check.out" 2>&1 ||
  fail "after the server went away during a save to s3://data/cut/ck, loading it exited with $? ($(tail -3 "$dir/check.out"))"
grep -q "step 1" "$dir/check.out" || fail "s3://data/cut/ck is not the earlier checkpoint: $(tail -1 "$dir/check.out")"
echo "ok: the server unreachable during a save over s3://data/cut/ck: exit $code, $(grep -o "writing s3://[^ ]*" "$dir/cut.log" | head -1) named; step 1 loads whole"
unset HANG_WIDTH LF_CHECKPOINT_ROOT
"$python" -c "import boto3,os; boto3.client('s3',endpoint_url=os.environ['AWS_ENDPOINT_URL']).put_object(Bucket='data',Key='half/__0_0.distcp',Body=b'x')"

# 5. Refusals, each naming the URL.
refused() {  # refused PATTERN WHAT COMMAND...: exit 1 and PATTERN in the output
  local pattern=$1 what=$2; shift 2
  local code=0
  "$@" > "$dir/refused.out" 2>&1 || code=$?
  (( code == 1 )) || fail "$what: exit $code, expected 1 ($(tail -2 "$dir/refused.out"))"
  grep -q -- "$pattern" "$dir/refused.out" || fail "$what: the error does not say '$pattern': $(tail -2 "$dir/refused.out")"
  echo "ok: $what refused: $(grep -o -- "$pattern.*" "$dir/refused.out" | head -1 | cut -c1-160)"
}
refused "NoSuchBucket" "a missing bucket" "$checks" dump s3://nobucket/ids
refused "there is no index.json under s3://data/none" "a prefix without a dataset" "$checks" dump s3://data/none
refused "names no bucket" "a URL without a bucket" "$checks" dump s3:///ids
refused "uses the gs:// scheme, which is not supported" "an unknown scheme for a dataset" "$checks" dump gs://data/ids
refused "uses the http:// scheme, which is not supported" "an unknown scheme for a checkpoint" "$checks" load http://data/ck.ckpt
refused "cannot hold chunk chunk-0-" "a cache budget smaller than a chunk" env MAX_CACHE_BYTES=$((largest - 1)) "$checks" dump s3://data/ids
refused "more than this process's share of the cache budget" "a cache budget smaller than the chunks 3 workers' order reads at once" \
  env MAX_CACHE_BYTES=$largest "$checks" order s3://data/ids 1,0,3,4,1,2
refused "NoSuchKey" "a missing checkpoint" "$checks" load s3://data/ck/none.ckpt
refused "but no .metadata: a sharded save there did not finish" "a folder whose save did not finish" "$checks" load s3://data/half
code=0; "$run" model consolidate s3://data/half > "$dir/refused.out" 2>&1 || code=$?
(( code == 2 )) && grep -q "s3://data/half is not a sharded checkpoint: no .metadata" "$dir/refused.out" ||
  fail "consolidate of s3://data/half: exit $code ($(tail -1 "$dir/refused.out"))"
refused "already holds a dataset" "a second write to one prefix" "$checks" write ids s3://data/ids
refused "set AWS_ACCESS_KEY_ID" "no credentials" env -u AWS_ACCESS_KEY_ID "$checks" dump s3://data/ids
refused "SignatureDoesNotMatch" "a wrong secret" env AWS_SECRET_ACCESS_KEY=wrong "$checks" dump s3://data/ids
refused "InvalidAccessKeyId" "an unknown access key" env AWS_ACCESS_KEY_ID=AKIAUNKNOWN "$checks" dump s3://data/ids
# The server stopped after the dataset opened: the first chunk's download retries, then names it.
export LT_STREAMING_CACHE_DIR="$dir/cold-cache"
"$checks" dump-when s3://data/ids "$dir/go" > "$dir/midread.out" 2>&1 &
reader=$!
for _ in $(seq 200); do grep -q "^opened" "$dir/midread.out" && break; sleep 0.05; done
grep -q "^opened" "$dir/midread.out" || fail "the reader did not open s3://data/ids ($(tail -2 "$dir/midread.out"))"
kill "$server"; wait "$server" 2>/dev/null; server=""
touch "$dir/go"
code=0; wait "$reader" || code=$?
(( code == 1 )) || fail "a read with the server stopped: exit $code, expected 1 ($(tail -2 "$dir/midread.out"))"
grep -q "reading s3://data/ids/chunk-0-.*failed after 6 tries" "$dir/midread.out" || fail "the read with the server stopped does not name the chunk and the retries: $(tail -2 "$dir/midread.out")"
(( $(grep -c "^(" "$dir/midread.out") == 0 )) || fail "items were read without their chunk"
echo "ok: the server stopped mid-read: $(grep -o "reading s3://.*tries" "$dir/midread.out" | head -1)"
refused "failed after 6 tries" "opening with the server stopped" "$checks" dump s3://data/ids
echo "s3 streaming checks passed"
